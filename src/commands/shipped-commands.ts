import { readMemberRecords } from '../../decorators/records.js';
import type { DecoratedCommand } from './command-builder.js';
import { validateCommand } from './custom-command.js';
import type { CommandDescription } from './discovery.js';

/** A command's schema as built on the client, shipped into the sandbox with its code. */
export interface ShippedCommand extends CommandDescription {
  template: string;
  timeoutMs?: number;
}

/** Where a sandbox bundle leaves the shipped schemas, keyed by `Class.method`, before user code runs. */
export const SHIPPED_COMMANDS_KEY = Symbol.for('agent-sandbox.shipped-commands');

export function shippedCommands(): Record<string, ShippedCommand> | undefined {
  return (globalThis as Record<symbol, Record<string, ShippedCommand> | undefined>)[
    SHIPPED_COMMANDS_KEY
  ];
}

/**
 * The commands of a class from shipped schemas: the bundle that runs in the sandbox may have lost
 * decorator metadata (esbuild does not emit it), but the client built and checked the schema
 * already. `undefined` when a registered method has no shipped schema (build it as usual then).
 */
export function fromShipped(
  cls: DecoratedCommand['cls'],
  shipped: Record<string, ShippedCommand>,
): DecoratedCommand[] | undefined {
  const methods = new Map(readMemberRecords(cls).methods.map((r) => [r.method, r]));
  const commands: DecoratedCommand[] = [];
  for (const method of methods.keys()) {
    if (typeof method !== 'string') return undefined;
    const place = `${cls.name}.${method}`;
    const entry = shipped[place];
    if (!entry) return undefined;
    const { command } = validateCommand({ ...entry, source: 'decorator' });
    if (!command) return undefined;
    commands.push({ command, cls, method, place });
  }
  return commands;
}
