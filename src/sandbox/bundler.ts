import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { build } from 'esbuild';
import type { ShippedCommand } from '../commands/shipped-commands.js';
import { SandboxError } from '../errors.js';
import { packageInfo } from '../util/package-info.js';

/**
 * Bundles user command modules into one CommonJS file for the command server's `--load`: the
 * modules, what they import, and this package's authoring half (decorators + commandManifest).
 * The schemas built on the client ride along, so the bundle needs no decorator metadata; esbuild
 * (which drops metadata) can then compile TypeScript sources as well as compiled JS.
 */
export async function bundleCommands(
  files: readonly string[],
  shipped: Record<string, ShippedCommand>,
): Promise<string> {
  const root = packageInfo().root;
  const authoring = join(root, 'dist', 'authoring.cjs');
  if (!existsSync(authoring)) {
    throw new SandboxError(`${authoring} is missing: build the package first (npm run build)`);
  }
  const entry = [
    "require('reflect-metadata');",
    `globalThis[Symbol.for('agent-sandbox.shipped-commands')] = ${JSON.stringify(shipped)};`,
    ...files.map((file) => `require(${JSON.stringify(file)});`),
    `module.exports = require(${JSON.stringify(authoring)}).commandManifest();`,
  ].join('\n');
  try {
    const result = await build({
      stdin: {
        contents: entry,
        resolveDir: root,
        sourcefile: 'abx-commands-entry.js',
        loader: 'js',
      },
      bundle: true,
      platform: 'node',
      format: 'cjs',
      target: 'node20',
      write: false,
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
    });
    return result.outputFiles[0]?.text ?? '';
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
