import { lsTool } from '../../../runtime/server/file-tools/ls.js';
import { runProgram } from './prelude.js';

runProgram<'ls'>(lsTool);
