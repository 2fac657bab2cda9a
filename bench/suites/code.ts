// `--only code` (bench/README.md).
import { Sandbox } from 'abx-sandbox';
import { log, ms, results, row, scale } from '../runner.js';
import { median, round, summarize, timeEach } from '../stats.js';

/** Issue 16: a runCode round trip (`1+1` in a warm context) against a fresh interpreter per call. */
export async function code(sandbox: Sandbox) {
  log('runCode');
  await sandbox.runCode('1+1'); // the default context's interpreter starts once
  const runCode = await timeEach(scale(50, 15), () => sandbox.runCode('1+1'), 3);
  const fresh = await timeEach(
    scale(20, 8),
    () => sandbox.commands.run("python3 -c 'print(1+1)'"),
    2,
  );
  results.code = { runCode: summarize(runCode), pythonPerCall: summarize(fresh) };
  row('10 code', 'runCode("1+1"), warm context', ms(summarize(runCode)));
  row(
    '10 code',
    'commands.run("python3 -c \'print(1+1)\'")',
    ms(summarize(fresh)),
    `runCode ${round(median(fresh) / median(runCode), 1)}× faster`,
  );
}
