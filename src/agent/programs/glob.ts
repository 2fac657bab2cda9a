import { globTool } from '../../../runtime/server/file-tools/glob.js';
import { runProgram } from './prelude.js';

runProgram<'glob'>(globTool);
