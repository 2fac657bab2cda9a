import { lstatSync, rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { codeOf, fsError } from './fs.js';
import type { PathRequest, ToolAnswer } from './protocol.js';

/** Deletes a file or a directory tree; lstat, not stat: a broken symlink is deleted like a file. */
export async function deleteTool(p: PathRequest): Promise<ToolAnswer<'delete'>> {
  const target = resolve(p.path);
  try {
    lstatSync(target);
  } catch (e) {
    const code = codeOf(e);
    return code === 'ENOENT' || code === 'ENOTDIR' ? { error: 'not_found' } : fsError(e);
  }
  try {
    rmSync(target, { recursive: true, force: false });
  } catch (e) {
    return fsError(e);
  }
  return { deleted: true };
}
