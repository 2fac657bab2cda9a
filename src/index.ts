import './reflect-metadata.js';

export type {
  ArgOptions,
  RegisterOptions,
  SandboxDecorator,
  SandboxOptions,
} from '../decorators/index.js';
export { arg, float, int, sandbox } from '../decorators/index.js';
export { BaseSandbox } from './agent/base-sandbox.js';
export type { CommandHost } from './agent/command-tools.js';
export type {
  DeepAgentsBackend,
  DeepAgentsBackendOptions,
  DeepAgentsFileInfo,
} from './agent/deepagents.js';
export { DEEPAGENTS_SEARCH_BUDGET_MS, deepAgentsBackend } from './agent/deepagents.js';
export {
  formatContentWithLineNumbers,
  LINE_NUMBER_WIDTH,
  MAX_LINE_LENGTH,
} from './agent/format.js';
export type { LocalShellSandboxOptions } from './agent/local-shell-sandbox.js';
export { LocalShellSandbox } from './agent/local-shell-sandbox.js';
export type {
  AnthropicTool,
  OpenAIResponsesTool,
  OpenAITool,
  StandardResult,
  ToolInputSchema,
  ToolStandardSchema,
  VercelAITool,
} from './agent/tool-adapters.js';
export {
  callTool,
  toAnthropicTools,
  toOpenAIResponsesTools,
  toOpenAITools,
  toVercelAITools,
} from './agent/tool-adapters.js';
export { ToolCallError } from './agent/tool-error.js';
export type { ToolRunner } from './agent/tool-runner.js';
export type { ToolParameters, ToolProperty } from './agent/tool-schema.js';
export type { FileToolName, JsonValue, SandboxTool } from './agent/tool-types.js';
export { FILE_TOOL_NAMES } from './agent/tool-types.js';
export type { SandboxToolsOptions } from './agent/tools.js';
export { sandboxTools } from './agent/tools.js';
export type {
  DeleteResult,
  EditOptions,
  EditResult,
  ExecuteOffloadResult,
  ExecuteOptions,
  ExecuteResponse,
  ExecuteWithOffloadOptions,
  FileData,
  FileDownloadResponse,
  FileInfo,
  FileOperationError,
  FileUploadResponse,
  GlobOptions,
  GlobResult,
  GrepMatch,
  GrepOptions,
  GrepResult,
  LsResult,
  ReadOptions,
  ReadResult,
  WriteResult,
} from './agent/types.js';
export { commandUsage, parseCommandArgs, validateKwargs } from './commands/arguments.js';
export type { DecoratedCommand } from './commands/command-builder.js';
export type { CommandManifest, ManifestCommand } from './commands/command-bundle.js';
export { commandManifest } from './commands/command-bundle.js';
export type { CommandRegistry } from './commands/command-registry.js';
export { commandRegistry } from './commands/command-registry.js';
export type { ArgType, ArgValue, CommandSource, Kwargs } from './commands/custom-command.js';
export { ARG_TYPES, CustomCommand, CustomCommandArg } from './commands/custom-command.js';
export type { CommandDescription } from './commands/discovery.js';
export { describeCommand, formatCommandTable } from './commands/discovery.js';
export type { CommandJSONSchema } from './commands/json-schema.js';
export { toJSONSchema } from './commands/json-schema.js';
export { listCommands } from './commands/list-commands.js';
export { renderShellCommand } from './commands/shell-template.js';
export type { Capability, TemplateSpec } from './commands/template.js';
export { CAPABILITIES, loadTemplate, parseTemplate } from './commands/template.js';
export type { ResourceOptions, StepOptions } from './commands/template-builder.js';
export { Template } from './commands/template-builder.js';
export type { SetupStep } from './commands/template-runtime.js';
export type { CommandResult, ErrorBody } from './errors.js';
export {
  ArchiveError,
  ArgumentError,
  AuthenticationError,
  CapabilityError,
  CommandDefinitionError,
  CommandExitError,
  CommandNotFoundError,
  CommandTimeoutError,
  DaemonUnavailableError,
  DuplicateCommandError,
  errorFromBody,
  InvalidArgumentError,
  LimitExceededError,
  NodeLineError,
  NotFoundError,
  PermissionDeniedError,
  SandboxError,
  SandboxNotFoundError,
  SandboxStartError,
  SecretConflictError,
  SecretNotFoundError,
  ServerCommandError,
  ServerNotRunningError,
  TemplateBuildError,
  TemplateConflictError,
  TemplateError,
  TemplateNotFoundError,
  TimeoutError,
  UnavailableError,
  UpstreamError,
  VolumeConflictError,
  VolumeNotFoundError,
  WebhookNotFoundError,
  WebhookVerificationError,
} from './errors.js';
export type { ConnectionOptions } from './installation/daemon-connection.js';
export type { DaemonInfo } from './installation/daemon-info.js';
export type { McpServerHandle, ServeMcpOptions } from './mcp/serve-mcp.js';
export { serveMcp } from './mcp/serve-mcp.js';
export type { ApiKeyInfo } from './sandbox/api-keys.js';
export { ApiKeys } from './sandbox/api-keys.js';
export type {
  CodeContext,
  CodeLanguage,
  ExecutionError,
  OutputMessage,
  RunCodeOptions,
} from './sandbox/code.js';
export { Execution, Result } from './sandbox/code.js';
export type { HandleOptions, OutputCallbacks } from './sandbox/command-handle.js';
export { CommandHandle } from './sandbox/command-handle.js';
export type {
  CommandConnectOptions,
  CommandStartOptions,
  ProcessInfo,
  RunOptions,
} from './sandbox/commands.js';
export type { EntryInfo, WriteData, WriteEntry, WriteOptions } from './sandbox/filesystem.js';
export type {
  SandboxCreateOptions,
  SandboxInfo,
  SandboxListFilter,
  SandboxWorkspace,
} from './sandbox/sandbox.js';
export { Sandbox } from './sandbox/sandbox.js';
export type {
  EgressProxy,
  NetworkEvent,
  NetworkInfo,
  NetworkPolicy,
  SandboxMetric,
  WorkspaceApplyRequest,
  WorkspaceRequest,
} from './sandbox/sandbox-api.js';
export type {
  SandboxAuditEntry,
  SandboxAuditKind,
  SandboxAuditOptions,
  SandboxAuditPage,
} from './sandbox/sandbox-audit.js';
export type {
  FollowEventsOptions,
  SandboxEventPage,
  SandboxEventsOptions,
  SandboxEventType,
  SandboxLifecycleEvent,
} from './sandbox/sandbox-events.js';
export type {
  SandboxLogLevel,
  SandboxLogLine,
  SandboxLogsOptions,
} from './sandbox/sandbox-logs.js';
export type { SecretInfo } from './sandbox/secret.js';
export { Secret } from './sandbox/secret.js';
export type { ServerClient, ServerStartOptions } from './sandbox/server-client.js';
export type { TemplateInfo } from './sandbox/templates.js';
export { Templates } from './sandbox/templates.js';
export type { VolumeInfo, VolumeMounts } from './sandbox/volume.js';
export { Volume } from './sandbox/volume.js';
export type { WatchEvent, WatchEventType, WatchOptions } from './sandbox/watch-handle.js';
export { WatchHandle } from './sandbox/watch-handle.js';
export type { WebhookDelivery, WebhookInfo, WebhookOptions } from './sandbox/webhook.js';
export { Webhook } from './sandbox/webhook.js';
export type { WorkspaceApplyLocalRequest } from './sandbox/workspace-upload.js';
export {
  e2bWebhookSignature,
  signWebhook,
  verifyWebhook,
  WEBHOOK_TOLERANCE_SECONDS,
} from './util/webhook-signature.js';
export type {
  ApplyOptions as WorkspaceApplyOptions,
  ApplyResult as WorkspaceApplyResult,
  ChangeStatus as WorkspaceChangeStatus,
  ChangesOptions as WorkspaceChangesOptions,
  DiffOptions as WorkspaceDiffOptions,
  DiffStatEntry as WorkspaceDiffStatEntry,
  EntryKind as WorkspaceEntryKind,
  EntryState as WorkspaceEntryState,
  OmittedChange as WorkspaceOmittedChange,
  Refusal as WorkspaceRefusal,
  WorkspaceChange,
  WorkspaceChanges,
  WorkspaceDiff,
  WriteRollback as WorkspaceWriteRollback,
} from './workspace/index.js';
export {
  apply as applyWorkspaceChanges,
  changes as workspaceChanges,
  diff as workspaceDiff,
  WorkspaceError,
  WorkspaceRefusedError,
  WorkspaceWriteError,
} from './workspace/index.js';
