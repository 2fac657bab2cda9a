import { randomBytes } from 'node:crypto';
import { shellQuote } from '../util/shell-quote.js';
import type { BaseSandbox } from './base-sandbox.js';
import {
  type HelperOutcome,
  helperCommand,
  isHelperError,
  MAX_COMMAND_CHARS,
  runHelper,
} from './helper.js';
import type { EditPayload, HelperAnswer, ProgramError } from './programs/protocol.js';
import type { EditOptions, EditResult } from './types.js';

/** old + new above this many UTF-8 bytes travel as uploaded temp files, not in the command. */
export const EDIT_INLINE_MAX_BYTES = 50_000;

function editError(path: string, oldString: string, answer: ProgramError): string {
  switch (answer.error) {
    case 'file_not_found':
      return `Error: File '${path}' not found`;
    case 'is_directory':
      return `Error: '${path}' is a directory, not a file`;
    case 'not_a_file':
      return `Error: '${path}' is not a regular file`;
    case 'not_text':
      return `Error: File '${path}' is not a text file (not valid UTF-8); it cannot be edited as text`;
    case 'permission_denied':
      return `Error: Permission denied editing '${path}'`;
    case 'not_found':
      return `Error: String not found in file '${path}': '${oldString}'`;
    case 'multiple':
      return `Error: String '${oldString}' appears ${answer.count} times in '${path}'. Use replaceAll: true to replace every occurrence, or give more surrounding context to make it unique.`;
    default:
      return `Error editing '${path}': ${answer.detail ?? answer.error}`;
  }
}

function settle(
  path: string,
  oldString: string,
  outcome: HelperOutcome<HelperAnswer<'edit'>>,
): EditResult {
  if (!outcome.ok) return { error: `Error editing '${path}': ${outcome.error}` };
  const answer = outcome.value;
  if (isHelperError(answer)) return { error: editError(path, oldString, answer) };
  return { path, occurrences: answer.count };
}

/** {@link BaseSandbox.edit}: inline for small payloads, via uploaded temp files for large ones. */
export async function editFile(
  sandbox: BaseSandbox,
  path: string,
  oldString: string,
  newString: string,
  options: EditOptions = {},
): Promise<EditResult> {
  if (oldString === '') return { error: 'Error: oldString must not be empty' };
  const oldBytes = Buffer.from(oldString, 'utf8');
  const newBytes = Buffer.from(newString, 'utf8');
  const replaceAll = options.replaceAll ?? false;
  const inline: EditPayload = {
    path,
    replaceAll,
    old: oldBytes.toString('base64'),
    new: newBytes.toString('base64'),
  };
  if (
    oldBytes.length + newBytes.length <= EDIT_INLINE_MAX_BYTES &&
    helperCommand(sandbox.interpreter, 'edit', inline).length <= MAX_COMMAND_CHARS
  ) {
    return settle(path, oldString, await runHelper(sandbox, 'edit', inline));
  }
  const stem = `/tmp/.abx-edit-${randomBytes(10).toString('hex')}`;
  const oldFile = `${stem}-old`;
  const newFile = `${stem}-new`;
  const removeTemps = `rm -f ${shellQuote(oldFile)} ${shellQuote(newFile)}`;
  try {
    const uploads = await sandbox.uploadFiles([
      [oldFile, oldBytes],
      [newFile, newBytes],
    ]);
    const failed = uploads.find((u) => u.error);
    if (failed)
      return { error: `Error editing '${path}': uploading the edit failed (${failed.error})` };
    return settle(
      path,
      oldString,
      await runHelper(sandbox, 'edit', { path, replaceAll, oldFile, newFile }),
    );
  } finally {
    // The program removes them itself; this covers a missing interpreter or a failed upload.
    await sandbox.execute(removeTemps).catch(() => undefined);
  }
}
