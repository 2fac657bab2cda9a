import { randomBytes } from 'node:crypto';
import type {
  EditRequest,
  ToolName,
  ToolRequest,
} from '../../runtime/server/file-tools/protocol.js';
import { shellQuote } from '../util/shell-quote.js';
import type { BaseSandbox } from './base-sandbox.js';
import { helperCommand, MAX_COMMAND_CHARS, runHelper } from './helper.js';
import type { ProgramPayload } from './programs/protocol.js';
import type { ToolOutcome, ToolRunner } from './tool-runner.js';

/** old + new above this many UTF-8 bytes travel as uploaded temp files, not in the command. */
export const EDIT_INLINE_MAX_BYTES = 50_000;

/**
 * The {@link ToolRunner} of any {@link BaseSandbox}: each call runs a small program with the
 * sandbox's `interpreter` through `execute()` (helper.ts), so a backend that can run a shell
 * command gets every tool. It costs a process per call and needs Node.js in the sandbox.
 */
export function executeRunner(sandbox: BaseSandbox): ToolRunner {
  return {
    run<N extends ToolName>(tool: N, request: ToolRequest<N>): Promise<ToolOutcome<N>> {
      if (tool === 'edit') {
        return runEdit(sandbox, request as EditRequest) as Promise<ToolOutcome<N>>;
      }
      return runHelper(sandbox, tool, request as ProgramPayload<N>);
    },
  };
}

/** An edit inline when it fits in one command, else with its strings in uploaded temp files. */
async function runEdit(sandbox: BaseSandbox, request: EditRequest): Promise<ToolOutcome<'edit'>> {
  const oldBytes = Buffer.from(request.old, 'base64');
  const newBytes = Buffer.from(request.new, 'base64');
  if (
    oldBytes.length + newBytes.length <= EDIT_INLINE_MAX_BYTES &&
    helperCommand(sandbox.interpreter, 'edit', request).length <= MAX_COMMAND_CHARS
  ) {
    return runHelper(sandbox, 'edit', request);
  }
  const stem = `/tmp/.abx-edit-${randomBytes(10).toString('hex')}`;
  const oldFile = `${stem}-old`;
  const newFile = `${stem}-new`;
  try {
    const uploads = await sandbox.uploadFiles([
      [oldFile, oldBytes],
      [newFile, newBytes],
    ]);
    const failed = uploads.find((u) => u.error);
    if (failed) return { ok: false, error: `uploading the edit failed (${failed.error})` };
    return await runHelper(sandbox, 'edit', {
      path: request.path,
      replaceAll: request.replaceAll,
      oldFile,
      newFile,
    });
  } finally {
    // The program removes them itself; this covers a missing interpreter or a failed upload.
    await sandbox
      .execute(`rm -f ${shellQuote(oldFile)} ${shellQuote(newFile)}`)
      .catch(() => undefined);
  }
}
