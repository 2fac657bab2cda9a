import './reflect-metadata.js';

/**
 * The authoring half of the package: decorators and the command model, without the SDK's
 * network and control-plane code. `sandbox.server.start()` bundles user modules against this
 * entry, so the bundle that runs in a sandbox stays small and needs no native module. Users may
 * import from `agent-sandbox/authoring` in their command modules for the same reason.
 */
export { arg, float, int, sandbox } from '../decorators/index.js';
export { commandUsage, parseCommandArgs, validateKwargs } from './commands/arguments.js';
export { commandManifest } from './commands/command-bundle.js';
export { commandRegistry } from './commands/command-registry.js';
export { describeCommand } from './commands/discovery.js';
export { listCommands } from './commands/list-commands.js';
