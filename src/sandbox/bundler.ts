import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { type BuildOptions, build, version as esbuildVersion } from 'esbuild';
import type { ShippedCommand } from '../commands/shipped-commands.js';
import { SandboxError } from '../errors.js';
import { packageInfo } from '../util/package-info.js';

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

/**
 * Bundles user command modules into one CommonJS file for the command server's `--load`: the
 * modules, what they import, and this package's authoring half (decorators + commandManifest).
 * The schemas built on the client ride along, so the bundle needs no decorator metadata; esbuild
 * (which drops metadata) can then compile TypeScript sources as well as compiled JS.
 */
export async function bundleCommands(
  files: readonly string[],
  shipped: Record<string, ShippedCommand>,
): Promise<BuiltBundle> {
  const authoring = authoringFile();
  if (!existsSync(authoring)) {
    throw new SandboxError(`${authoring} is missing: build the package first (npm run build)`);
  }
  const options = bundleOptions(authoring);
  const root = options.absWorkingDir as string;
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
