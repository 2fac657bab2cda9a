// `--only memory` (bench/README.md).
import { Sandbox } from 'abx-sandbox';
import { BenchCommands } from '../commands.js';
import {
  daemonInfo,
  idleServerPid,
  rssMiB,
  sandboxPidMemory,
  sandboxRssMiB,
  serverOsPid,
} from '../measure.js';
import { goal, log, results, row, scale } from '../runner.js';
import { round, throughput } from '../stats.js';

export async function memory(template: string) {
  log('memory');
  // A fresh sandbox: the figures are of idle processes, not of what earlier benchmarks did.
  const sandbox = await Sandbox.create({ template });
  try {
    await sandbox.server.start({ commands: [BenchCommands] });
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const envd = await sandboxRssMiB(sandbox, 'envd.cjs');
    const serverPid = await serverOsPid(sandbox);
    const idle = (await sandboxPidMemory(sandbox, serverPid)).rssMiB;
    // The idle process envd keeps for the next start (a start took the pool's; this is the next).
    const prestarted = await sandboxPidMemory(sandbox, await idleServerPid(sandbox));
    // The floor: a Node process doing nothing, started the same way in the same sandbox.
    const { stdout: bare } = await sandbox.commands.run(
      "node -e 'setTimeout(() => {}, 10000)' >/dev/null 2>&1 & p=$!; sleep 1.5; echo $p",
    );
    const nodeFloor = await sandboxPidMemory(sandbox, Number(bare.trim()));
    await sandbox.commands.run(`kill ${Number(bare.trim())}`);
    const calls = scale(100_000, 10_000);
    // A first round grows the heap to its working size; growth after it is what would leak.
    await throughput(32, calls / 10, (i) => sandbox.server.call('add', { x: i }));
    const warm = (await sandboxPidMemory(sandbox, serverPid)).rssMiB;
    const load = await throughput(32, calls, (i) => sandbox.server.call('add', { x: i }));
    const after = (await sandboxPidMemory(sandbox, serverPid)).rssMiB;
    const daemonBefore = rssMiB(daemonInfo().pid);
    const count = scale(100, 20);
    const many: Sandbox[] = [];
    for (let i = 0; i < count; i++) many.push(await Sandbox.create({ template }));
    const daemonWith = rssMiB(daemonInfo().pid);
    await Promise.all(many.map((s) => s.kill()));
    results.memoryMiB = {
      envd,
      serverIdle: idle,
      prestartedIdleRss: prestarted.rssMiB,
      prestartedIdlePrivate: prestarted.privateMiB,
      nodeFloorRss: nodeFloor.rssMiB,
      nodeFloorPrivate: nodeFloor.privateMiB,
      serverWarm: warm,
      serverAfterCalls: after,
      calls,
      callsPerSecond: round(load.perSecond, 0),
      daemon: daemonBefore,
      daemonWithSandboxes: daemonWith,
      sandboxes: count,
    };
    goal(
      'serverIdleProcessRssMiB',
      "RSS of envd's idle pre-started command server process",
      prestarted.rssMiB,
      'MiB',
      20,
      false,
    );
    goal(
      'serverIdleProcessPrivateMiB',
      'private memory (USS) of that idle process: what it adds to the sandbox',
      prestarted.privateMiB,
      'MiB',
      20,
      false,
    );
    row('8 memory', 'RSS envd / server idle', `${envd} / ${idle} MiB`, 'goal < 60 MiB each');
    row(
      '8 memory',
      'idle pre-started server process: RSS / private (USS)',
      `${prestarted.rssMiB} / ${prestarted.privateMiB} MiB`,
      `goal RSS ≤ 20 MiB; \`node -e\` idle in the same sandbox: ${nodeFloor.rssMiB} / ${nodeFloor.privateMiB} MiB (the rest of RSS is the node binary's pages, shared with envd)`,
    );
    row(
      '8 memory',
      `server RSS warm, then after ${calls} more calls`,
      `${warm} → ${after} MiB (${after >= warm ? '+' : ''}${round(after - warm, 1)})`,
      'goal: no growth beyond noise',
    );
    row(
      '8 memory',
      `daemon RSS, then with ${count} sandboxes`,
      `${daemonBefore} → ${daemonWith} MiB`,
    );
  } finally {
    await sandbox.kill();
  }
}
