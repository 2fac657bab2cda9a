// Compiled (never run) by `npm run typecheck` (tsconfig.json takes test/) against the real packages' own types: each
// adapter's output must be accepted where those packages take tools. A type error here is a
// user's type error.
import type { Tool as AnthropicSdkTool } from '@anthropic-ai/sdk/resources/messages';
import type { Tool as McpTool } from '@modelcontextprotocol/sdk/types.js';
import { type ToolSet as ToolSet7, tool as tool7 } from 'ai';
import { jsonSchema as jsonSchema5, type ToolSet as ToolSet5 } from 'ai-v5';
import type { ToolSet as ToolSet6 } from 'ai-v6';
import type { ChatCompletionTool } from 'openai/resources/chat/completions';
import type { FunctionTool } from 'openai/resources/responses/responses';
import {
  type SandboxTool,
  toAnthropicTools,
  toOpenAIResponsesTools,
  toOpenAITools,
  toVercelAITools,
} from '../../src/index.js';
import { mcpToolInfo } from '../../src/mcp/tool-result.js';

declare const tools: SandboxTool[];

// Vercel AI SDK 7 and 6: Standard Schemas, as they are.
export const ai7: ToolSet7 = toVercelAITools(tools);
export const ai6: ToolSet6 = toVercelAITools(tools);
// One of them through the SDK's own tool() helper too.
const add = toVercelAITools(tools).add;
export const wrapped = add ? tool7(add) : undefined;
// Vercel AI SDK 5: its own jsonSchema() makes the schemas.
export const ai5: ToolSet5 = toVercelAITools(tools, { jsonSchema: jsonSchema5 });

// OpenAI: Chat Completions and the Responses API.
export const chat: ChatCompletionTool[] = toOpenAITools(tools);
export const responses: FunctionTool[] = toOpenAIResponsesTools(tools);

// Anthropic Messages.
export const anthropic: AnthropicSdkTool[] = toAnthropicTools(tools);

// MCP's tools/list entries.
export const mcp: McpTool[] = tools.map(mcpToolInfo);
