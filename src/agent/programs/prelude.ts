import { readFileSync } from 'node:fs';
import { answerOf } from '../../../runtime/server/file-tools/fs.js';
import type { ToolName } from '../../../runtime/server/file-tools/protocol.js';
import { type ProgramAnswer, type ProgramPayload, RESULT_MARK } from './protocol.js';

function answer(value: unknown): void {
  process.stdout.write(`\n${RESULT_MARK}${JSON.stringify(value)}\n`);
}

/**
 * Runs a tool on the JSON payload from stdin and prints its answer. A throw becomes an answer
 * too (`unexpected: true`), so the host always gets one.
 */
export function runProgram<N extends ToolName>(
  main: (payload: ProgramPayload<N>) => Promise<ProgramAnswer<N>>,
): void {
  let input: ProgramPayload<N> | undefined;
  try {
    input = JSON.parse(readFileSync(0, 'utf8'));
  } catch {
    input = undefined;
  }
  if (input === undefined) answer({ error: 'bad_payload' });
  else answerOf(() => main(input)).then(answer);
}
