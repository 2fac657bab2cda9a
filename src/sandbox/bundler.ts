import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import {
  type BuildOptions,
  build,
  version as esbuildVersion,
  type Plugin,
  transform,
} from 'esbuild';
import { AUTHORING_GLOBAL_KEY } from '../../runtime/protocol/constants.js';
import type { ShippedCommand } from '../commands/shipped-commands.js';
import { CommandDefinitionError, SandboxError } from '../errors.js';
import { packageInfo } from '../util/package-info.js';
import { extractCommandClasses } from './class-extractor.js';
import { locatorOfMap, sourceLocator } from './source-locations.js';

/** A bundle and what it was built from. */
export interface BuiltBundle {
  /** The CommonJS code the command server loads. */
  code: string;
  /** Absolute paths of every file esbuild read for it: the modules, their imports, the authoring half. */
  inputs: string[];
}

/** This package's authoring half, which every bundle includes; missing until the package is built. */
function authoringFile(): string {
  return join(packageInfo().root, 'dist', 'authoring.cjs');
}

/**
 * Where a bundle's authoring half comes from: `inline`, bundled into it (it then runs on any
 * command server); `shared`, the one the command server loads before it (`--authoring-sha256`:
 * the runtime's `authoring.cjs`, loaded ahead in a pre-started server), so the bundle holds only
 * the user's code and loads in a few milliseconds instead of ~100.
 */
export type AuthoringMode = 'inline' | 'shared';

/** The package's names as a module imports them (the second: packs made before the rename). */
const PACKAGE_NAMES = /^(abx-sandbox|agent-sandbox)(\/authoring)?$/;

/**
 * What `require('abx-sandbox')` is in a `shared` bundle: the authoring half the command server
 * put on the global object before loading the bundle.
 */
const AUTHORING_SHIM = `const authoring = globalThis[Symbol.for(${JSON.stringify(AUTHORING_GLOBAL_KEY)})];
if (authoring === undefined) {
  throw new Error("this command bundle takes agent-sandbox's authoring half from the command server, which was started without one: start it with --authoring-sha256 (sandbox.server.start() does)");
}
module.exports = authoring;
`;

/**
 * Resolves the package's authoring half to {@link AUTHORING_SHIM} in a `shared` bundle: by its
 * names (`abx-sandbox`, `abx-sandbox/authoring`, and `agent-sandbox`, the name of packs built
 * before the package was renamed) and by the paths of its entry files (a module
 * of this repository that imports `src/authoring.ts`), so a bundle never carries a second copy
 * with a command registry of its own.
 */
function sharedAuthoring(root: string): Plugin {
  const own = new Set(
    ['src/authoring.ts', 'dist/authoring.cjs', 'dist/authoring.js'].map((f) => join(root, f)),
  );
  const shim = { path: 'abx-sandbox', namespace: 'abx-authoring' };
  return {
    name: 'abx-shared-authoring',
    setup(plugin) {
      plugin.onResolve({ filter: PACKAGE_NAMES }, () => shim);
      plugin.onResolve({ filter: /authoring(\.[cm]?[jt]s)?$/ }, async (args) => {
        if (args.pluginData === shim) return undefined;
        const found = await plugin.resolve(args.path, {
          kind: args.kind,
          importer: args.importer,
          resolveDir: args.resolveDir,
          pluginData: shim,
        });
        return own.has(found.path) ? shim : undefined;
      });
      plugin.onLoad({ filter: /.*/, namespace: 'abx-authoring' }, () => ({
        contents: AUTHORING_SHIM,
        loader: 'js',
      }));
    },
  };
}

/** Every esbuild option but the entry; a bundle cache keys on them too. */
function bundleOptions(authoring: string, mode: AuthoringMode = 'inline'): BuildOptions {
  return {
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    write: false,
    metafile: true,
    absWorkingDir: packageInfo().root,
    // A module's `import ... from 'abx-sandbox'` gets the authoring half only: no SDK, no
    // native modules inside the sandbox (a shared bundle: the server's, see sharedAuthoring).
    ...(mode === 'inline'
      ? {
          alias: Object.fromEntries(
            ['abx-sandbox', 'agent-sandbox'].flatMap((name) => [
              [name, authoring],
              [`${name}/authoring`, authoring],
            ]),
          ),
        }
      : {}),
    tsconfigRaw: {
      compilerOptions: { experimentalDecorators: true, useDefineForClassFields: false },
    },
    // CommonJS has no import.meta; modules that read import.meta.url get this file's URL.
    banner: {
      js: "const __abx_import_meta_url = require('url').pathToFileURL(__filename).href;",
    },
    define: { 'import.meta.url': '__abx_import_meta_url' },
    // Shipped schemas are keyed by Class.method: class names must survive bundling.
    keepNames: true,
    logLevel: 'silent',
    legalComments: 'none',
  };
}

/**
 * What decides a bundle's bytes besides its input files and entry: esbuild's version and options.
 * A bundle cache keys on it, so a new esbuild or a changed option never serves an old bundle.
 */
export function bundlerFingerprint(mode: AuthoringMode = 'inline'): string {
  return createHash('sha256')
    .update(JSON.stringify([esbuildVersion, mode, bundleOptions(authoringFile(), mode)]))
    .digest('hex');
}

const TYPESCRIPT = /\.[cm]?tsx?$/;

/**
 * What goes into the bundle of each module that defines command classes: the module as it is
 * when it is all declarations, else only the classes and what they use (see
 * {@link extractCommandClasses}), so that the rest of a script never runs in the sandbox.
 */
async function extractions(classes: Record<string, readonly string[]>): Promise<Plugin> {
  const contents = new Map<string, string>();
  for (const [file, names] of Object.entries(classes)) {
    let source: string;
    try {
      source = await readFile(file, 'utf8');
    } catch {
      continue; // esbuild reports the missing file in its own words
    }
    let code = source;
    let locate = await sourceLocator(file, source);
    if (TYPESCRIPT.test(file)) {
      // acorn reads JavaScript: compile first (esbuild, as the bundle will), keeping a line map.
      try {
        const compiled = await transform(source, {
          loader: file.endsWith('x') ? 'tsx' : 'ts',
          sourcefile: file,
          sourcemap: 'external',
          target: 'esnext',
          tsconfigRaw: {
            compilerOptions: { experimentalDecorators: true, useDefineForClassFields: false },
          },
        });
        code = compiled.code;
        locate = locatorOfMap(compiled.map, file, file);
      } catch {
        continue; // a syntax error: esbuild says where when it bundles the file
      }
    }
    const extracted = extractCommandClasses(file, code, names, locate);
    if (extracted !== undefined) contents.set(file, extracted);
  }
  return {
    name: 'abx-command-classes',
    setup(plugin) {
      plugin.onLoad({ filter: /.*/ }, (args) => {
        const code = contents.get(args.path);
        return code === undefined
          ? undefined
          : { contents: code, loader: 'js', resolveDir: dirname(args.path) };
      });
    },
  };
}

/**
 * Bundles user command modules into one CommonJS file for the command server's `--load`: the
 * modules, what they import, and this package's authoring half (decorators + commandManifest).
 * The schemas built on the client ride along, so the bundle needs no decorator metadata; esbuild
 * (which drops metadata) can then compile TypeScript sources as well as compiled JS.
 *
 * `classes` names, per module file, the decorated classes it defines that the server serves: a
 * module that is more than declarations (a script with top-level `await` or a `main()` call) is
 * cut down to them; it throws a {@link CommandDefinitionError} naming `module:line` when that
 * cannot be done safely.
 */
export async function bundleCommands(
  files: readonly string[],
  shipped: Record<string, ShippedCommand>,
  classes: Record<string, readonly string[]> = {},
  mode: AuthoringMode = 'inline',
): Promise<BuiltBundle> {
  const authoring = authoringFile();
  if (mode === 'inline' && !existsSync(authoring)) {
    throw new SandboxError(`${authoring} is missing: build the package first (npm run build)`);
  }
  const options = bundleOptions(authoring, mode);
  const root = options.absWorkingDir as string;
  const plugin = await extractions(classes);
  const sourcefile = 'abx-commands-entry.js';
  // A shared bundle's authoring half is loaded already: the server put it there before the bundle.
  const entry = [
    mode === 'inline'
      ? "require('reflect-metadata');"
      : "const authoring = require('abx-sandbox');",
    `globalThis[Symbol.for('agent-sandbox.shipped-commands')] = ${JSON.stringify(shipped)};`,
    ...files.map((file) => `require(${JSON.stringify(file)});`),
    mode === 'inline'
      ? `module.exports = require(${JSON.stringify(authoring)}).commandManifest();`
      : 'module.exports = authoring.commandManifest();',
  ].join('\n');
  try {
    const result = await build({
      ...options,
      plugins: mode === 'inline' ? [plugin] : [sharedAuthoring(root), plugin],
      stdin: {
        contents: entry,
        resolveDir: root,
        sourcefile,
        loader: 'js',
      },
    });
    // Input names are relative to the working directory; the entry and the shim are no files.
    const inputs = Object.keys(result.metafile?.inputs ?? {})
      .filter((name) => name !== sourcefile && !name.startsWith('abx-authoring:'))
      .map((name) => resolve(root, name));
    return { code: result.outputFiles?.[0]?.text ?? '', inputs };
  } catch (error) {
    const errors = (
      error as { errors?: { text: string; location?: { file: string; line: number } }[] }
    ).errors;
    const detail = errors
      ?.map((e) => `${e.location ? `${e.location.file}:${e.location.line}: ` : ''}${e.text}`)
      .join('\n');
    throw new SandboxError(
      `cannot bundle the command modules: ${detail ?? (error as Error).message}`,
      {
        cause: error,
      },
    );
  }
}
