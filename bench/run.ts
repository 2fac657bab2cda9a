// npm run bench [-- --quick] [-- --only a,b]: every benchmark of bench/README.md on real sandboxes,
// in one run. Writes bench/results.json and prints a Markdown table. Nothing here asserts a time
// limit. The runner's state is bench/runner.ts; each suite is a module of bench/suites/.
import 'reflect-metadata';
import { spawnSync } from 'node:child_process';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox, Templates } from 'abx-sandbox';
import { unmountUnder } from '../src/providers/local/volumes.js';
import { BenchCommands } from './commands.js';
import {
  children,
  goals,
  HOME,
  met,
  ONLY,
  QUICK,
  ROOT,
  report,
  results,
  runs,
  table,
} from './runner.js';
import { callLatency, callThroughput, hops } from './suites/calls.js';
import { cliStart } from './suites/cli.js';
import { code } from './suites/code.js';
import { deepagentsSearch } from './suites/deepagents-search.js';
import { density, densityCount } from './suites/density.js';
import { e2b } from './suites/e2b.js';
import { egress } from './suites/egress.js';
import { fork } from './suites/fork.js';
import { images } from './suites/images.js';
import { lifecycle, serverStart } from './suites/lifecycle.js';
import { memory } from './suites/memory.js';
import { pauses } from './suites/pause.js';
import { tcpAuditCost } from './suites/tcp-audit.js';
import { agentTools } from './suites/tools.js';
import { transfers } from './suites/transfers.js';
import { transfersDirect } from './suites/transfers-direct.js';
import { volumes } from './suites/volumes.js';
import { workspaceMount } from './suites/workspace.js';
import { webhookCost } from './webhooks.js';

async function main() {
  // Everything from the first call that starts the daemon is inside the try: a run that fails to
  // build the template or start the first sandbox still stops the daemon and removes its home.
  try {
    const templateFile = join(HOME, 'bench.yaml');
    writeFileSync(
      templateFile,
      'name: bench\ncapabilities: [shell, files, code, ports]\ntimeout: 30m\n',
    );
    const { name: template } = await Templates.build(templateFile);
    const sandbox = await Sandbox.create({ template });
    await sandbox.server.start({ commands: [BenchCommands] });
    const state = JSON.parse(await sandbox.files.read('/home/user/.abx/server/server-8080.json'));
    if (runs('hops')) await hops(sandbox);
    if (runs('calls')) await callLatency(sandbox);
    if (runs('throughput')) await callThroughput(sandbox, state.token);
    if (runs('lifecycle')) await lifecycle(template);
    if (runs('server-start')) await serverStart(sandbox, template);
    if (runs('transfers')) await transfers(sandbox);
    if (runs('transfers-direct')) await transfersDirect(report);
    if (runs('tools')) await agentTools(sandbox);
    if (runs('memory')) await memory(template);
    if (runs('code')) await code(sandbox);
    if (runs('images')) await images(template);
    if (runs('e2b')) await e2b(sandbox);
    if (runs('cli')) await cliStart();
    if (runs('egress')) await egress();
    if (runs('pause')) await pauses(template);
    if (runs('fork')) await fork(template);
    if (runs('volumes')) await volumes(template);
    if (runs('deepagents')) await deepagentsSearch(report);
    if (runs('workspace')) await workspaceMount(report, template);
    if (runs('webhooks')) await webhookCost(report);
    if (runs('density')) await density(report, densityCount());
    if (runs('tcp-audit')) await tcpAuditCost(report);
  } finally {
    for (const child of children) child.kill('SIGKILL');
    for (const info of await Sandbox.list({ state: ['running', 'paused'] })) {
      await Sandbox.kill(info.sandboxId);
    }
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), 'daemon', 'stop'], {
      env: process.env,
    });
    // A volume left mounted (a run that failed mid-way) is unmounted before its folder goes.
    await unmountUnder(HOME).catch(() => undefined);
    rmSync(HOME, { recursive: true, force: true });
  }
  results.finishedAt = new Date().toISOString();
  // A partial run prints its table but keeps the last whole run's results.json.
  if (!ONLY) {
    writeFileSync(join(ROOT, 'bench', 'results.json'), `${JSON.stringify(results, null, 2)}\n`);
  }
  const lines = [
    `Machine: ${(results.machine as { cpu: string }).cpu}, ${(results.machine as { cores: number }).cores} cores, Node ${process.version}${QUICK ? ' (--quick)' : ''}`,
    '',
    '| benchmark | figure | value | note |',
    '| --- | --- | --- | --- |',
    ...table.map((cells) => `| ${cells.join(' | ')} |`),
    '',
    '| goal (results.json key) | figure | value | floor in the same run | goal | met |',
    '| --- | --- | --- | --- | --- | --- |',
    ...goals.map(
      (g) =>
        `| \`${g.key}\` | ${g.figure} | ${g.value} ${g.unit} | ${g.floor ? `${g.floor.value} ${g.floor.unit} (${g.floor.what})` : '—'} | ${g.atLeast ? '≥' : '≤'} ${g.target} ${g.unit} | ${met(g) ? 'met' : 'not met'} |`,
    ),
  ];
  console.log(lines.join('\n'));
}

await main();
