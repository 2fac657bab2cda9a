import { readTool } from '../../../runtime/server/file-tools/read.js';
import { runProgram } from './prelude.js';

runProgram<'read'>(readTool);
