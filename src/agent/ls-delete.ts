import type { BaseSandbox } from './base-sandbox.js';
import { isHelperError, runHelper } from './helper.js';
import type { DeleteResult, FileInfo, LsResult } from './types.js';

/** One level, hidden entries included, sorted by name; symlinks are described, not followed. */
const LS_PROGRAM = `
function main(p) {
  const dir = path.resolve(p.path);
  let st;
  try {
    st = fs.statSync(dir);
  } catch (e) {
    return fsError(e);
  }
  if (!st.isDirectory()) return { error: 'not_a_directory' };
  let names;
  try {
    names = fs.readdirSync(dir).sort();
  } catch (e) {
    return fsError(e);
  }
  return {
    entries: names.map((name) => {
      const full = path.join(dir, name);
      try {
        const s = fs.lstatSync(full);
        return { path: full, isDir: s.isDirectory(), size: s.size, modifiedAt: s.mtime.toISOString() };
      } catch (e) {
        return { path: full, isDir: false };
      }
    }),
  };
}
`;

/** lstat, not stat: a broken symlink exists and is deleted like any file. */
const DELETE_PROGRAM = `
function main(p) {
  const target = path.resolve(p.path);
  try {
    fs.lstatSync(target);
  } catch (e) {
    return e.code === 'ENOENT' || e.code === 'ENOTDIR' ? { error: 'not_found' } : fsError(e);
  }
  try {
    fs.rmSync(target, { recursive: true, force: false });
  } catch (e) {
    return fsError(e);
  }
  return { deleted: true };
}
`;

/** {@link BaseSandbox.ls}. */
export async function listDirectory(sandbox: BaseSandbox, path: string): Promise<LsResult> {
  const outcome = await runHelper<{ entries: FileInfo[] } | Record<string, unknown>>(
    sandbox,
    LS_PROGRAM,
    { path },
  );
  if (!outcome.ok) return { error: outcome.error };
  const answer = outcome.value;
  if (!isHelperError(answer)) return { entries: (answer as { entries: FileInfo[] }).entries };
  switch (answer.error) {
    case 'file_not_found':
      return { error: `Path '${path}' not found` };
    case 'not_a_directory':
      return { error: `Path '${path}' is not a directory` };
    case 'permission_denied':
      return { error: `Permission denied listing '${path}'` };
    default:
      return { error: `Error listing '${path}': ${answer.detail ?? answer.error}` };
  }
}

/** {@link BaseSandbox.delete}. */
export async function deletePath(sandbox: BaseSandbox, path: string): Promise<DeleteResult> {
  if (path === '') return { error: 'Error: path is empty' };
  const outcome = await runHelper<Record<string, unknown>>(sandbox, DELETE_PROGRAM, { path });
  if (!outcome.ok) return { error: outcome.error };
  const answer = outcome.value;
  if (!isHelperError(answer)) return { path };
  switch (answer.error) {
    case 'not_found':
      return { error: `Error: '${path}' not found` };
    case 'permission_denied':
      return { error: `Error: Permission denied deleting '${path}'` };
    default:
      return { error: `Error deleting '${path}': ${answer.detail ?? answer.error}` };
  }
}
