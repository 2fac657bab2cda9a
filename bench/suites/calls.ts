// `--only hops`, `--only calls`, `--only throughput` (bench/README.md).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { Sandbox } from 'abx-sandbox';
import { Client, type Dispatcher, Pool } from 'undici';
import { daemonInfo, envdSocketOf, startListening } from '../measure.js';
import { goal, log, ms, ROOT, results, row, scale } from '../runner.js';
import { round, type Summary, summarize, throughput, timeEach } from '../stats.js';

export async function callLatency(sandbox: Sandbox) {
  log('call latency: server vs source delivery');
  const server = summarize(
    await timeEach(scale(1000, 200), (i) => sandbox.server.call('add', { x: i, y: 1 })),
  );
  const source = summarize(
    await timeEach(scale(100, 20), async (i) => {
      await sandbox.files.write(
        '/tmp/job.js',
        `console.log(JSON.stringify({ result: ${i} + 1 }));`,
      );
      return JSON.parse((await sandbox.commands.run('node /tmp/job.js')).stdout).result;
    }),
  );
  const ratio = source.p50 / server.p50;
  results.callLatency = { server, sourceDelivery: source };
  goal('serverVsSourceDeliveryRatio', 'server call vs source delivery', ratio, '×', 20, true);
  // The two most common hops on a running sandbox, end to end through the SDK.
  const run = summarize(await timeEach(scale(200, 60), () => sandbox.commands.run('true')));
  const write = summarize(
    await timeEach(scale(200, 60), () => sandbox.files.write('/tmp/two.txt', 'hi')),
  );
  results.hops = { commandsRun: run, filesWrite: write };
  // Their goals, against the floors measured beside them, are in `hops` below.
  row('1 call latency', "commands.run('true')", ms(run));
  row('1 call latency', 'files.write of 2 bytes', ms(write));
  row('1 call latency', 'server.call (gateway)', ms(server));
  row('1 call latency', 'files.write + commands.run', ms(source));
  row('1 call latency', 'source delivery / server', `${round(ratio, 1)}×`, 'goal ≥ 20×');
}

/**
 * Where the time of `commands.run('true')` and of a 2-byte `files.write` goes: the same request
 * at each hop from the process up to the SDK, interleaved (one call of each per round) so that
 * noise falls on all of them alike. Each figure includes the ones below it.
 */
export async function hops(sandbox: Sandbox) {
  log('per-hop cost of commands.run and files.write');
  const hello = await startListening(process.execPath, [
    join(ROOT, 'bench', 'reference', 'hello.cjs'),
  ]);
  const loopback = new Pool(`http://127.0.0.1:${hello.port}`);
  const direct = new Client('http://localhost', { socketPath: envdSocketOf(sandbox.sandboxId) });
  const gateway = new Pool(daemonInfo().gatewayUrl);
  const auth = { authorization: `Bearer ${sandbox.accessToken}` };
  const viaGateway = {
    'x-sandbox-id': sandbox.sandboxId,
    'x-sandbox-port': '49983',
    'x-access-token': sandbox.accessToken,
  };
  const exec = JSON.stringify({ cmd: 'true', timeout: 60, stdin: false });
  const json = { 'content-type': 'application/json' };
  const bytes = { 'content-type': 'application/octet-stream' };
  const drain = async (answer: Promise<Dispatcher.ResponseData>) => {
    const res = await answer;
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`bench: ${res.statusCode} ${text}`);
  };
  const calls: Record<string, () => Promise<unknown>> = {
    'loopback HTTP round trip (node:http)': () =>
      drain(loopback.request({ path: '/', method: 'GET' })),
    'process: sh -c true, spawned on the host': () =>
      new Promise((resolve, reject) =>
        spawn('/bin/sh', ['-c', 'true'], { stdio: 'ignore' })
          .once('exit', resolve)
          .once('error', reject),
      ),
    'run: envd direct, POST /exec': () =>
      drain(
        direct.request({
          path: '/exec',
          method: 'POST',
          headers: { ...auth, ...json },
          body: exec,
        }),
      ),
    'run: gateway → envd, POST /exec': () =>
      drain(
        gateway.request({
          path: '/exec',
          method: 'POST',
          headers: { ...viaGateway, ...json },
          body: exec,
        }),
      ),
    "run: SDK commands.run('true')": () => sandbox.commands.run('true'),
    'write: envd direct, PUT /files/write': () =>
      drain(
        direct.request({
          path: '/files/write?path=/tmp/hop.txt',
          method: 'PUT',
          headers: { ...auth, ...bytes },
          body: 'hi',
        }),
      ),
    'write: gateway → envd, PUT /files/write': () =>
      drain(
        gateway.request({
          path: '/files/write?path=/tmp/hop.txt',
          method: 'PUT',
          headers: { ...viaGateway, ...bytes },
          body: 'hi',
        }),
      ),
    'write: SDK files.write, 2 bytes': () => sandbox.files.write('/tmp/hop.txt', 'hi'),
  };
  const samples: Record<string, number[]> = Object.fromEntries(
    Object.keys(calls).map((k) => [k, []]),
  );
  const rounds = scale(300, 80);
  for (let i = 0; i < rounds + 10; i++) {
    for (const [name, call] of Object.entries(calls)) {
      const started = performance.now();
      await call();
      if (i >= 10) samples[name]?.push(performance.now() - started);
    }
  }
  await Promise.all([loopback.close(), direct.close(), gateway.close()]);
  const figures = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, summarize(v)]));
  results.hopProfile = figures;
  // The goals of issue 49: commands.run within 1 ms of the bare process it runs, a 2-byte write
  // within 1 ms, each against its floor of this run (interleaved with it, so noise falls alike).
  const p50 = (name: string) => figures[name]?.p50 ?? Number.NaN;
  const spawnFloor = p50('process: sh -c true, spawned on the host');
  const loopbackFloor = p50('loopback HTTP round trip (node:http)');
  goal(
    'commandsRunP50Ms',
    "commands.run('true') p50",
    p50("run: SDK commands.run('true')"),
    'ms',
    spawnFloor + 1,
    false,
    { value: spawnFloor, unit: 'ms', what: '`sh -c true` spawned by Node on the host' },
  );
  results.commandsRunOverheadMs = round(p50("run: SDK commands.run('true')") - spawnFloor, 2);
  goal(
    'filesWriteP50Ms',
    'files.write of 2 bytes p50',
    p50('write: SDK files.write, 2 bytes'),
    'ms',
    1,
    false,
    { value: loopbackFloor, unit: 'ms', what: 'a loopback `node:http` round trip' },
  );
  // Each hop against the one it adds to: envd's run against the bare process, its write against
  // the bare loopback round trip, the gateway against envd direct, the SDK against the gateway.
  const bases: Record<string, [string, string]> = {
    'run: envd direct, POST /exec': ['process: sh -c true, spawned on the host', 'the process'],
    'run: gateway → envd, POST /exec': ['run: envd direct, POST /exec', 'envd direct'],
    "run: SDK commands.run('true')": ['run: gateway → envd, POST /exec', 'the raw gateway call'],
    'write: envd direct, PUT /files/write': [
      'loopback HTTP round trip (node:http)',
      'a loopback round trip',
    ],
    'write: gateway → envd, PUT /files/write': [
      'write: envd direct, PUT /files/write',
      'envd direct',
    ],
    'write: SDK files.write, 2 bytes': [
      'write: gateway → envd, PUT /files/write',
      'the raw gateway call',
    ],
  };
  for (const [name, figure] of Object.entries(figures)) {
    const [base, label] = bases[name] ?? [];
    const over = base ? figures[base]?.p50 : undefined;
    const delta = over === undefined ? undefined : round(figure.p50 - over, 2);
    row(
      '1 per hop',
      name,
      ms(figure),
      delta === undefined ? '' : `${delta < 0 ? '−' : '+'}${Math.abs(delta)} ms over ${label}`,
    );
  }
}

export async function callThroughput(sandbox: Sandbox, serverToken: string) {
  log('throughput: gateway, direct, python reference, node:http floor');
  const direct = await startListening(
    process.execPath,
    [
      join(ROOT, 'dist', 'runtime', 'server.cjs'),
      '--port',
      '0',
      '--load',
      join(ROOT, 'bench', 'reference', 'add-manifest.cjs'),
    ],
    { ...process.env, ABX_SERVER_TOKEN: serverToken },
  );
  const python = await startListening('python3', [
    join(ROOT, 'bench', 'reference', 'server.py'),
    '0',
    serverToken,
  ]);
  const hello = await startListening(process.execPath, [
    join(ROOT, 'bench', 'reference', 'hello.cjs'),
  ]);
  const gateway = daemonInfo().gatewayUrl;
  const body = JSON.stringify({ x: 1, y: 2 });
  const targets = {
    floor: { url: `http://127.0.0.1:${hello.port}`, headers: {} },
    direct: {
      url: `http://127.0.0.1:${direct.port}`,
      headers: { authorization: `Bearer ${serverToken}` },
    },
    python: {
      url: `http://127.0.0.1:${python.port}`,
      headers: { authorization: `Bearer ${serverToken}` },
    },
    gateway: {
      url: gateway,
      headers: {
        authorization: `Bearer ${serverToken}`,
        'x-sandbox-id': sandbox.sandboxId,
        'x-sandbox-port': '8080',
        'x-access-token': sandbox.accessToken,
      },
    },
  };
  const levels = [1, 8, 32, 128];
  const total = scale(10_000, 2_000);
  const figures: Record<string, Record<number, { perSecond: number; latency: Summary }>> = {};
  for (const [name, target] of Object.entries(targets)) {
    figures[name] = {};
    for (const concurrency of levels) {
      const pool = new Pool(target.url, { connections: concurrency });
      const call = async () => {
        const res = await pool.request({
          path: '/commands/add',
          method: 'POST',
          headers: { 'content-type': 'application/json', ...target.headers },
          body,
        });
        const text = await res.body.text();
        if (res.statusCode !== 200) throw new Error(`${name}: ${res.statusCode} ${text}`);
      };
      (figures[name] as Record<number, unknown>)[concurrency] = await throughput(
        concurrency,
        total,
        call,
      );
      await pool.close();
    }
  }
  results.throughput = figures;
  for (const concurrency of levels) {
    const rate = (name: string) => figures[name]?.[concurrency]?.perSecond ?? Number.NaN;
    row(
      '2 throughput',
      `c=${concurrency}: floor / direct / gateway / python`,
      `${[rate('floor'), rate('direct'), rate('gateway'), rate('python')].map((r) => Math.round(r)).join(' / ')} calls/s`,
      `direct ${Math.round((100 * rate('direct')) / rate('floor'))}% of floor, gateway ${Math.round((100 * rate('gateway')) / rate('floor'))}%, direct ${round(rate('direct') / rate('python'), 1)}× python`,
    );
  }
  const p99 = (name: string) => figures[name]?.[32]?.latency.p99 ?? Number.NaN;
  row(
    '2 throughput',
    'p99 at c=32: direct / gateway / python',
    `${[p99('direct'), p99('gateway'), p99('python')].map((v) => round(v, 2)).join(' / ')} ms`,
  );
  const share = (name: string, concurrency: number) =>
    (figures[name]?.[concurrency]?.perSecond ?? Number.NaN) /
    (figures.floor?.[concurrency]?.perSecond ?? Number.NaN);
  const floorC32 = {
    value: figures.floor?.[32]?.perSecond ?? Number.NaN,
    unit: 'calls/s',
    what: 'bare `node:http`, c=32',
  };
  const vsPython = (concurrency: number) =>
    (figures.direct?.[concurrency]?.perSecond ?? Number.NaN) /
    (figures.python?.[concurrency]?.perSecond ?? Number.NaN);
  goal(
    'gatewayShareOfFloorC32',
    'gateway throughput over the node:http floor, c=32 (ratio 0–1)',
    share('gateway', 32),
    '',
    0.5,
    true,
    floorC32,
  );
  goal(
    'directShareOfFloorC32',
    'command server direct throughput over the floor, c=32 (ratio 0–1)',
    share('direct', 32),
    '',
    0.8,
    true,
    floorC32,
  );
  goal('vsPythonC1', 'command server vs the Python reference, c=1', vsPython(1), '×', 1.5, true);
  goal('vsPythonC32', 'command server vs the Python reference, c=32', vsPython(32), '×', 5, true);
  const one = (name: string) => figures[name]?.[1]?.latency.p50 ?? Number.NaN;
  const gatewayCost = one('gateway') - one('direct');
  results.gatewayCostMs = round(gatewayCost, 3);
  row('3 gateway cost', 'p50 at c=1: gateway − direct', `${round(gatewayCost, 3)} ms per call`);
}
