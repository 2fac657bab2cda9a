import { readFileSync, rmSync } from 'node:fs';
import { editText, editTool } from '../../../runtime/server/file-tools/edit.js';
import { runProgram } from './prelude.js';
import type { EditProgramPayload } from './protocol.js';

/** The strings of a large edit come in uploaded files, removed once read (whatever happens). */
function fromFiles(oldFile: string, newFile: string): [string, string] {
  try {
    return [readFileSync(oldFile, 'utf8'), readFileSync(newFile, 'utf8')];
  } finally {
    rmSync(oldFile, { force: true });
    rmSync(newFile, { force: true });
  }
}

runProgram<'edit'>(async (p: EditProgramPayload) => {
  if (!('oldFile' in p)) return editTool(p);
  const [oldString, newString] = fromFiles(p.oldFile, p.newFile);
  return editText(p.path, oldString, newString, p.replaceAll);
});
