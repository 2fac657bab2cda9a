import { createRequire } from 'node:module';
import { resolve } from 'node:path';
import type { ArgSpec } from '../protocol/arguments.js';
import type { RegisteredCommand } from './command-table.js';
import { ManifestError } from './errors.js';

/** Manifest versions this server reads (see `commandManifest` in src/commands/command-bundle.ts). */
const KNOWN_VERSIONS = [1];
/**
 * Loads a command bundle: a CommonJS file whose `module.exports` is a manifest
 * `{ version: 1, template, commands: [{ name, description, args, timeoutMs?, invoke }] }`, as
 * `commandManifest(template)` of agent-sandbox builds it. Its classes are instantiated by the
 * bundle, once, so their state lives as long as the server.
 *
 * @throws ManifestError naming the file and what is wrong with it.
 */
export function loadManifest(file: string): RegisteredCommand[] {
  const path = resolve(file);
  let loaded: unknown;
  try {
    loaded = createRequire(path)(path);
  } catch (error) {
    throw new ManifestError(`cannot load ${path}: ${(error as Error).message}`, { cause: error });
  }
  const manifest = loaded as { version?: unknown; commands?: unknown } | null;
  if (typeof manifest !== 'object' || manifest === null || !('version' in manifest)) {
    throw new ManifestError(
      `${path} does not export a command manifest; its module.exports must be commandManifest('<template>') from agent-sandbox`,
    );
  }
  if (!KNOWN_VERSIONS.includes(manifest.version as number)) {
    throw new ManifestError(
      `${path} is a command manifest of version ${JSON.stringify(manifest.version)}, but this server reads version ${KNOWN_VERSIONS.join(', ')}; rebuild the bundle and the server from the same agent-sandbox release`,
    );
  }
  if (!Array.isArray(manifest.commands)) {
    throw new ManifestError(`${path}: commands must be a list`);
  }
  return manifest.commands.map((entry: unknown, i): RegisteredCommand => {
    const c = entry as Partial<RegisteredCommand> & { invoke?: unknown };
    const where = `${path}: commands[${i}] (${String(c?.name)})`;
    if (typeof c?.name !== 'string' || typeof c.invoke !== 'function' || !Array.isArray(c.args)) {
      throw new ManifestError(`${where} needs a string name, an args list and an invoke function`);
    }
    const invoke = c.invoke as (kwargs: Record<string, unknown>) => unknown;
    return {
      name: c.name,
      description: typeof c.description === 'string' ? c.description : '',
      args: c.args as ArgSpec[],
      ...(typeof c.timeoutMs === 'number' ? { timeoutMs: c.timeoutMs } : {}),
      handler: (kwargs) => invoke(kwargs),
    };
  });
}
