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
import type { EditOptions, EditResult } from './types.js';

/** old + new above this many UTF-8 bytes travel as uploaded temp files, not in the command. */
export const EDIT_INLINE_MAX_BYTES = 50_000;

/**
 * Replaces on the sandbox side; the file never travels. When `old` is not found as given, its
 * CRLF and LF variants are tried (read() hands out LF text, files on disk may be CRLF) and `new`
 * gets the same transform, so the file keeps its line endings. The result is written to a temp
 * file in the same directory and renamed over the original (mode kept, symlinks followed), so a
 * failed edit leaves the file as it was.
 */
const EDIT_PROGRAM = String.raw`
function count(text, part) {
  let n = 0;
  for (let i = text.indexOf(part); i !== -1; i = text.indexOf(part, i + part.length)) n += 1;
  return n;
}
function strings(p) {
  if (!p.oldFile) return [Buffer.from(p.old, 'base64').toString('utf8'), Buffer.from(p.new, 'base64').toString('utf8')];
  try {
    return [fs.readFileSync(p.oldFile, 'utf8'), fs.readFileSync(p.newFile, 'utf8')];
  } finally {
    fs.rmSync(p.oldFile, { force: true });
    fs.rmSync(p.newFile, { force: true });
  }
}
function main(p) {
  const pair = strings(p);
  const target = path.resolve(p.path);
  let real;
  let st;
  try {
    real = fs.realpathSync(target);
    st = fs.statSync(real);
  } catch (e) {
    return fsError(e);
  }
  if (st.isDirectory()) return { error: 'is_directory' };
  if (!st.isFile()) return { error: 'not_a_file' };
  let raw;
  try {
    raw = fs.readFileSync(real);
  } catch (e) {
    return fsError(e);
  }
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(raw);
  } catch (e) {
    return { error: 'not_text' };
  }
  const lf = (s) => s.split('\r\n').join('\n');
  const crlf = (s) => lf(s).split('\n').join('\r\n');
  const candidates = [pair, [crlf(pair[0]), crlf(pair[1])], [lf(pair[0]), lf(pair[1])]];
  let found = 0;
  let oldText = pair[0];
  let newText = pair[1];
  for (const c of candidates) {
    found = count(text, c[0]);
    if (found > 0) {
      oldText = c[0];
      newText = c[1];
      break;
    }
  }
  if (found === 0) return { error: 'not_found' };
  if (found > 1 && !p.replaceAll) return { error: 'multiple', count: found };
  let result;
  if (p.replaceAll) result = text.split(oldText).join(newText);
  else {
    const at = text.indexOf(oldText);
    result = text.slice(0, at) + newText + text.slice(at + oldText.length);
  }
  const temp = path.join(path.dirname(real), '.' + path.basename(real) + '.abx-edit-' + process.pid + '.tmp');
  try {
    fs.writeFileSync(temp, result, { mode: st.mode & 4095, flag: 'wx' });
    fs.chmodSync(temp, st.mode & 4095);
    fs.renameSync(temp, real);
  } catch (e) {
    fs.rmSync(temp, { force: true });
    // A directory we may not create files in can still hold a file we may write.
    if (e.code !== 'EACCES' && e.code !== 'EPERM') return fsError(e);
    try {
      fs.writeFileSync(real, result);
    } catch (e2) {
      return fsError(e2);
    }
  }
  return { count: found };
}
`;

function editError(path: string, oldString: string, answer: Record<string, unknown>): string {
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

function settle(path: string, oldString: string, outcome: HelperOutcome<unknown>): EditResult {
  if (!outcome.ok) return { error: `Error editing '${path}': ${outcome.error}` };
  const answer = outcome.value as Record<string, unknown>;
  if (isHelperError(answer)) return { error: editError(path, oldString, answer) };
  return { path, occurrences: answer.count as number };
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
  const inline = {
    path,
    replaceAll,
    old: oldBytes.toString('base64'),
    new: newBytes.toString('base64'),
  };
  if (
    oldBytes.length + newBytes.length <= EDIT_INLINE_MAX_BYTES &&
    helperCommand(sandbox.interpreter, EDIT_PROGRAM, inline).length <= MAX_COMMAND_CHARS
  ) {
    return settle(path, oldString, await runHelper(sandbox, EDIT_PROGRAM, inline));
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
      await runHelper(sandbox, EDIT_PROGRAM, { path, replaceAll, oldFile, newFile }),
    );
  } finally {
    // The program removes them itself; this covers a missing interpreter or a failed upload.
    await sandbox.execute(removeTemps).catch(() => undefined);
  }
}
