import {
  chmodSync,
  realpathSync,
  renameSync,
  rmSync,
  type Stats,
  statSync,
  writeFileSync,
} from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { codeOf, fsError, readWhole } from './fs.js';
import type { EditRequest, ToolAnswer } from './protocol.js';
import { randomBytes } from './random.js';

/*
 * Replaces in place; the file never travels. When `old` is not found as given, its CRLF and LF
 * variants are tried (read hands out LF text, files on disk may be CRLF) and `new` gets the same
 * transform, so the file keeps its line endings. The result goes to a temp file in the same
 * directory, renamed over the original (mode kept, symlinks followed), so a failed edit leaves
 * the file as it was.
 */

function count(text: string, part: string): number {
  let n = 0;
  for (let i = text.indexOf(part); i !== -1; i = text.indexOf(part, i + part.length)) n += 1;
  return n;
}

/** The edit with `old` and `new` as text (the programs read large ones from uploaded files). */
export async function editText(
  path: string,
  oldString: string,
  newString: string,
  replaceAll: boolean,
): Promise<ToolAnswer<'edit'>> {
  const target = resolve(path);
  let real: string;
  let st: Stats;
  try {
    real = realpathSync(target);
    st = statSync(real);
  } catch (e) {
    return fsError(e);
  }
  if (st.isDirectory()) return { error: 'is_directory' };
  if (!st.isFile()) return { error: 'not_a_file' };
  let raw: Buffer;
  try {
    raw = readWhole(real);
  } catch (e) {
    return fsError(e);
  }
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(raw);
  } catch {
    return { error: 'not_text' };
  }
  const lf = (s: string) => s.split('\r\n').join('\n');
  const crlf = (s: string) => lf(s).split('\n').join('\r\n');
  const candidates: [string, string][] = [
    [oldString, newString],
    [crlf(oldString), crlf(newString)],
    [lf(oldString), lf(newString)],
  ];
  let found = 0;
  let oldText = oldString;
  let newText = newString;
  for (const [from, to] of candidates) {
    found = count(text, from);
    if (found > 0) {
      oldText = from;
      newText = to;
      break;
    }
  }
  if (found === 0) return { error: 'not_found' };
  if (found > 1 && !replaceAll) return { error: 'multiple', count: found };
  let result: string;
  if (replaceAll) result = text.split(oldText).join(newText);
  else {
    const at = text.indexOf(oldText);
    result = text.slice(0, at) + newText + text.slice(at + oldText.length);
  }
  const temp = join(
    dirname(real),
    `.${basename(real)}.abx-edit-${randomBytes(6).toString('hex')}.tmp`,
  );
  try {
    writeFileSync(temp, result, { mode: st.mode & 4095, flag: 'wx' });
    chmodSync(temp, st.mode & 4095);
    renameSync(temp, real);
  } catch (e) {
    rmSync(temp, { force: true });
    // A directory we may not create files in can still hold a file we may write.
    const code = codeOf(e);
    if (code !== 'EACCES' && code !== 'EPERM') return fsError(e);
    try {
      writeFileSync(real, result);
    } catch (e2) {
      return fsError(e2);
    }
  }
  return { count: found };
}

/** Replaces `old` by `new` (base64 of UTF-8) once, or every time with `replaceAll`. */
export function editTool(p: EditRequest): Promise<ToolAnswer<'edit'>> {
  return editText(
    p.path,
    Buffer.from(p.old, 'base64').toString('utf8'),
    Buffer.from(p.new, 'base64').toString('utf8'),
    p.replaceAll,
  );
}
