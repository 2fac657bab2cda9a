/**
 * `apply()` in a process of its own, run by the daemon as the user a workspace's writes belong
 * to (docs/workspaces.md, "Applying": never as root). It reads `{ changes, options }` as JSON on
 * stdin (the changes' view a staging copy that user may read), writes the host folder with that
 * user's rights only, and answers one JSON line: `{ result }`, or `{ error: { name, message,
 * refusals?, path?, written?,
 * rolledBack?, notRestored?, undone?, cause? } }` (a WorkspaceWriteError's fields, its cause's message). A self-contained file (dist/workspace-apply.cjs) that the
 * daemon runs with `node -e`, so that its path need not be one the user may reach.
 */
import { apply } from './apply.js';
import { WorkspaceRefusedError, WorkspaceWriteError } from './errors.js';
import type { WorkspaceChanges } from './types.js';

async function main(): Promise<void> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  const request = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
    changes: WorkspaceChanges;
    options: Parameters<typeof apply>[1];
  };
  try {
    const result = await apply(request.changes, request.options);
    process.stdout.write(`${JSON.stringify({ result })}\n`);
  } catch (error) {
    const e = error as Error;
    process.stdout.write(
      `${JSON.stringify({
        error: {
          name: e.name,
          message: e.message,
          ...(error instanceof WorkspaceRefusedError ? { refusals: error.refusals } : {}),
          ...(error instanceof WorkspaceWriteError
            ? {
                path: error.path,
                written: error.written,
                rolledBack: error.rolledBack,
                notRestored: error.notRestored,
                undone: error.undone,
                cause: error.cause instanceof Error ? error.cause.message : String(error.cause),
              }
            : {}),
        },
      })}\n`,
    );
  }
}

void main();
