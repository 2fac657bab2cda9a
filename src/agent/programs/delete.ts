import { deleteTool } from '../../../runtime/server/file-tools/delete.js';
import { runProgram } from './prelude.js';

runProgram<'delete'>(deleteTool);
