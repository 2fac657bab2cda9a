import { lstatSync, rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { codeOf, fsError, runProgram } from './prelude.js';
import type { DeleteDone, PathPayload, ProgramError } from './protocol.js';

/** lstat, not stat: a broken symlink exists and is deleted like any file. */
function main(p: PathPayload): DeleteDone | ProgramError {
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

runProgram<'delete'>(main);
