import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const FRAME_FILE = /\(?((?:file:\/\/)?\/[^()]+?):\d+:\d+\)?\s*$/;

/**
 * The file of the module that is applying a decorator: the first stack frame outside this
 * package's own code and node's internals. `sandbox.server.start({ commands: [Cls] })` bundles
 * that file for the sandbox, since a class object alone does not say where its code lives.
 */
export function callerFile(ownDirs: readonly string[]): string | undefined {
  const stack = new Error().stack?.split('\n').slice(1) ?? [];
  for (const frame of stack) {
    const match = FRAME_FILE.exec(frame.trim());
    if (!match?.[1]) continue;
    const file = match[1].startsWith('file://') ? fileURLToPath(match[1]) : match[1];
    if (ownDirs.some((dir) => file.startsWith(dir))) continue;
    // Helpers of bundlers and test runners live in node_modules or in virtual modules.
    if (file.includes('/node_modules/') || file.includes('\0') || !existsSync(file)) continue;
    return file;
  }
  return undefined;
}
