import type { RouteGroup } from '../route-group.js';
import { BROWSER } from './browser.js';
import { COMMANDS } from './commands.js';
import { CORE } from './core.js';
import { DEV_TOOLS } from './dev-tools.js';
import { FILE_OPS } from './files.js';
import { PROCESS } from './process.js';
import { SYSTEM } from './system.js';
import { TERMINAL } from './terminal.js';

/** Every route group, in the order `/capabilities` and the docs list them. */
export const ROUTE_GROUPS: readonly RouteGroup[] = [
  CORE,
  COMMANDS,
  FILE_OPS,
  PROCESS,
  SYSTEM,
  TERMINAL,
  DEV_TOOLS,
  BROWSER,
];
