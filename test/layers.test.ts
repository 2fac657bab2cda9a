import { readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { expect, test } from 'vitest';
import { ROOT } from './helpers/build.js';
import { sources, specifiers } from './helpers/imports.js';

// The package's layers, lowest first, and which layers each may import. The model (commands and
// decorators) and the agent file-tool protocol (BaseSandbox, tool adapters) sit under the SDK,
// the SDK under MCP and the CLI; providers sit under the control plane; the SDK and the control
// plane never import each other, and nobody imports the CLI. `runtime/` (node built-ins only, see test/server/imports.test.ts) and its
// protocol are shared by both sides.
const LAYERS: Record<string, string[]> = {
  runtime: ['runtime/'],
  base: ['src/util/', 'src/errors.ts'],
  // Egress policy, the egress service's process and a sandbox's network namespace: templates
  // read policies, providers enforce them, the control plane stores and changes them.
  egress: ['src/egress/'],
  model: ['decorators/', 'src/commands/', 'src/authoring.ts', 'src/reflect-metadata.ts'],
  // A workspace's changes, patch and apply: pure file work on two folders, for the control
  // plane (a sandbox's workspace) and the SDK (its types, and the functions for a user's own).
  workspace: ['src/workspace/'],
  installation: ['src/installation/'],
  providers: ['src/providers/'],
  compat: ['src/compat/'],
  control: ['src/control/'],
  agent: ['src/agent/'],
  sdk: ['src/sandbox/'],
  mcp: ['src/mcp/'],
  cli: ['src/cli/'],
  entry: ['src/index.ts'],
};
const BELOW: Record<string, string[]> = {
  runtime: [],
  base: ['runtime'],
  egress: ['base', 'runtime'],
  model: ['egress', 'base', 'runtime'],
  workspace: ['base', 'runtime'],
  installation: ['base', 'runtime'],
  providers: ['model', 'egress', 'base', 'runtime'],
  // Foreign wires (E2B's API) declare the services they need as interfaces and never import the
  // control plane: the daemon mounts them and hands them its services (src/control/e2b-mount.ts),
  // so the layer adds no state of its own and the control plane stays the one owner of it.
  compat: ['providers', 'installation', 'model', 'egress', 'base', 'runtime'],
  control: [
    'compat',
    'providers',
    'installation',
    'model',
    'workspace',
    'egress',
    'base',
    'runtime',
  ],
  agent: ['model', 'base', 'runtime'],
  sdk: ['agent', 'installation', 'model', 'workspace', 'base', 'runtime'],
  mcp: ['sdk', 'agent', 'installation', 'model', 'base', 'runtime'],
  // `abx doctor` runs the providers' own checks (bubblewrap, cgroups, uids, disks, the engine,
  // a sandbox's network) where the user is, with no daemon: the CLI may import providers and
  // egress, never the control plane.
  cli: ['mcp', 'sdk', 'agent', 'installation', 'providers', 'model', 'egress', 'base', 'runtime'],
  entry: ['mcp', 'sdk', 'agent', 'installation', 'model', 'workspace', 'base', 'runtime'],
};

function layerOf(file: string): string {
  // Specifiers name the emitted `.js`; the sources are `.ts`: compare without extensions.
  const path = relative(ROOT, file)
    .replaceAll('\\', '/')
    .replace(/\.[cm]?[jt]s$/, '');
  const found = Object.entries(LAYERS).find(([, prefixes]) =>
    prefixes.some((prefix) => {
      const bare = prefix.replace(/\.ts$/, '');
      return path === bare || (prefix.endsWith('/') && path.startsWith(prefix));
    }),
  );
  if (!found) throw new Error(`${path} belongs to no layer: add it to LAYERS`);
  return found[0];
}

test('every module imports only its own layer and the layers below it', () => {
  const files = ['src', 'decorators', 'runtime'].flatMap((dir) => sources(join(ROOT, dir)));
  expect(files.length).toBeGreaterThan(100);
  const offending: string[] = [];
  for (const file of files) {
    const from = layerOf(file);
    for (const spec of specifiers(readFileSync(file, 'utf8'))) {
      if (!spec.startsWith('.')) continue;
      const to = layerOf(join(file, '..', spec));
      if (to !== from && !BELOW[from]?.includes(to)) {
        offending.push(`${relative(ROOT, file)} (${from}) imports ${spec} (${to})`);
      }
    }
  }
  expect(offending).toEqual([]);
});

test('the layer table itself is a strict order: no two layers may import each other', () => {
  for (const [layer, below] of Object.entries(BELOW)) {
    for (const other of below) expect(BELOW[other], `${layer} ↔ ${other}`).not.toContain(layer);
  }
});
