import { grepTool } from '../../../runtime/server/file-tools/grep.js';
import { runProgram } from './prelude.js';

runProgram<'grep'>(grepTool);
