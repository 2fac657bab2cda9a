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

/** Every esbuild option but the entry; a bundle cache keys on them too. */
function bundleOptions(authoring: string): BuildOptions {
  return {
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    write: false,
    metafile: true,
    absWorkingDir: packageInfo().root,
    // A module's `import ... from 'agent-sandbox'` gets the authoring half only: no SDK, no
    // native modules inside the sandbox.
    alias: { 'agent-sandbox': authoring, 'agent-sandbox/authoring': authoring },
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
export function bundlerFingerprint(): string {
  return createHash('sha256')
    .update(JSON.stringify([esbuildVersion, bundleOptions(authoringFile())]))
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
): Promise<BuiltBundle> {
  const authoring = authoringFile();
  if (!existsSync(authoring)) {
    throw new SandboxError(`${authoring} is missing: build the package first (npm run build)`);
  }
  const options = bundleOptions(authoring);
  const root = options.absWorkingDir as string;
  const plugin = await extractions(classes);
  const sourcefile = 'abx-commands-entry.js';
  const entry = [
    "require('reflect-metadata');",
    `globalThis[Symbol.for('agent-sandbox.shipped-commands')] = ${JSON.stringify(shipped)};`,
    ...files.map((file) => `require(${JSON.stringify(file)});`),
    `module.exports = require(${JSON.stringify(authoring)}).commandManifest();`,
  ].join('\n');
  try {
    const result = await build({
      ...options,
      plugins: [plugin],
      stdin: {
        contents: entry,
        resolveDir: root,
        sourcefile,
        loader: 'js',
      },
    });
    // Input names are relative to the working directory; the entry itself is no file.
    const inputs = Object.keys(result.metafile?.inputs ?? {})
      .filter((name) => name !== sourcefile)
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
