import { copyFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { build } from 'esbuild';
import { defineConfig, type Options } from 'tsup';
import { PROGRAM_NAMES } from './src/agent/programs/protocol.js';

// tsup switches to swc (installed) for these files because tsconfig sets emitDecoratorMetadata;
// esbuild alone would drop the metadata.
const common = {
  target: 'node20',
  platform: 'node',
  sourcemap: true,
  outDir: 'dist',
} as const;

/** One self-contained CommonJS file per entry that plain `node` runs, no node_modules. */
const selfContained: Options = {
  format: ['cjs'],
  outExtension: () => ({ js: '.cjs' }),
  noExternal: [/.*/],
  splitting: false,
  clean: false,
  dts: false,
};

/**
 * The authoring half as command bundles use it in a sandbox: dist/authoring.cjs with its
 * dependencies, one file beside server.cjs. The command server loads it before a bundle (a
 * pre-started server ahead of time), so bundles carry only their own code. libphonenumber-js (a
 * third of it, for class-validator's IsPhoneNumber, which the command model never uses) is left
 * out: calling it says so. A user module that validates phone numbers bundles its own copy.
 */
async function runtimeAuthoring(): Promise<void> {
  await build({
    entryPoints: ['dist/authoring.cjs'],
    outfile: 'dist/runtime/authoring.cjs',
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    keepNames: true,
    legalComments: 'none',
    logLevel: 'warning',
    plugins: [
      {
        name: 'no-phone-numbers',
        setup(plugin) {
          plugin.onResolve({ filter: /^libphonenumber-js(\/.*)?$/ }, () => ({
            path: 'libphonenumber-js',
            namespace: 'left-out',
          }));
          plugin.onLoad({ filter: /.*/, namespace: 'left-out' }, () => ({
            loader: 'js',
            contents: `module.exports = new Proxy({}, { get: (_, name) => name === '__esModule' ? false : () => { throw new Error('libphonenumber-js is not in the sandbox runtime of agent-sandbox: import class-validator in your own module to validate phone numbers'); } });`,
          }));
        },
      },
    ],
  });
}

/**
 * Node's built-ins, in the ESM build, taken with `process.getBuiltinModule` (Node 22.3+) instead
 * of `import`: an `import` of a built-in makes an ES module facade of it, which reads every one of
 * its exports, lazy getters included. `node:http`'s getters load Node's internal undici (with
 * http2, tls, zlib, worker_threads), `node:crypto`'s all of WebCrypto, `node:fs`'s fs/promises:
 * about half of `abx list`'s start (bench/README.md, "abx start"). Each import statement of a
 * built-in in a chunk becomes a `const` on the same lines (source maps keep their lines).
 */
const BUILTINS = new Set(builtinModules);
const BUILTIN_IMPORT =
  /^import\s+(?:(\*\s+as\s+[\w$]+)|([\w$]+)?\s*,?\s*(\{[^}]*\})?)\s*from\s*"((?:node:)?[\w/]+)";/gm;

export function builtinsWithoutFacades(code: string): string {
  return code.replace(BUILTIN_IMPORT, (statement, star, name, named, from) => {
    if (!BUILTINS.has(from.replace(/^node:/, '')) || (!star && !name && !named)) return statement;
    const module = `process.getBuiltinModule(${JSON.stringify(from.startsWith('node:') ? from : `node:${from}`)})`;
    const bindings: string[] = [];
    if (star) bindings.push(`${star.replace(/^\*\s+as\s+/, '')} = ${module}`);
    if (name) bindings.push(`${name} = ${module}`);
    if (named) bindings.push(`${named.replace(/([\w$]+)\s+as\s+([\w$]+)/g, '$1: $2')} = ${module}`);
    return `const ${bindings.join(', ')};`;
  });
}

const withoutFacades = {
  name: 'builtins-without-facades',
  renderChunk(code: string, chunk: { path: string }) {
    return chunk.path.endsWith('.js') ? { code: builtinsWithoutFacades(code) } : undefined;
  },
};

export default defineConfig([
  {
    // ESM library and CLI in one build, so they share chunks: a module that the CLI imports and
    // that itself imports 'agent-sandbox' sees the same code.
    ...common,
    entry: {
      index: 'src/index.ts',
      authoring: 'src/authoring.ts',
      cli: 'src/cli/main.ts',
      daemon: 'src/control/daemon-main.ts',
      egress: 'src/egress/main.ts',
    },
    format: ['esm'],
    splitting: true,
    clean: false,
    plugins: [withoutFacades],
    dts: { entry: { index: 'src/index.ts', authoring: 'src/authoring.ts' } },
  },
  {
    ...common,
    entry: { index: 'src/index.ts', authoring: 'src/authoring.ts' },
    format: ['cjs'],
    // import.meta.url (used to find the package's own files) has no meaning in CommonJS.
    shims: true,
    dts: { entry: { index: 'src/index.ts', authoring: 'src/authoring.ts' } },
    onSuccess: runtimeAuthoring,
  },
  {
    // The in-sandbox command server: one self-contained file that runs with plain `node`, no
    // node_modules. runtime/ imports node: built-ins only, so bundling everything is just that.
    ...common,
    // js_driver is envd's JavaScript code-context driver, started next to it.
    entry: {
      server: 'runtime/server/main.ts',
      envd: 'runtime/envd/main.ts',
      js_driver: 'runtime/envd/code/js_driver.ts',
      // A root-allowing image sandbox's first process, and its `sudo` (runtime/root/).
      root: 'runtime/root/main.ts',
      sudo: 'runtime/root/sudo.ts',
    },
    outDir: 'dist/runtime',
    tsconfig: 'tsconfig.runtime.json',
    ...selfContained,
    // The Python driver is a plain file; envd starts it with the sandbox's python3 from here.
    onSuccess: async () => {
      copyFileSync('runtime/envd/code/python_driver.py', 'dist/runtime/python_driver.py');
    },
  },
  {
    // BaseSandbox's sandbox-side programs, sent as `node -e <text>`: self-contained CommonJS, no
    // source maps. Not minified (an error names a readable line); at 2-9 KB each they leave room
    // for the payload in a 128 KiB `sh -c` argument. The sandbox's node may be older than ours;
    // they need 14.14 (fs.rmSync). Their tsconfig has no decorator metadata, so tsup leaves swc
    // (and its `__name` wrappers) out.
    ...common,
    entry: Object.fromEntries(PROGRAM_NAMES.map((name) => [name, `src/agent/programs/${name}.ts`])),
    tsconfig: 'src/agent/programs/tsconfig.json',
    outDir: 'dist/agent',
    target: 'node14',
    sourcemap: false,
    ...selfContained,
  },
  {
    // A workspace's apply as the folder's user (src/workspace/apply-main.ts), which the daemon
    // runs with `node -e`: one file, no node_modules, no path the user must reach.
    ...common,
    entry: { 'workspace-apply': 'src/workspace/apply-main.ts' },
    sourcemap: false,
    ...selfContained,
  },
]);
