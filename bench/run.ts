// npm run bench [-- --quick]: every benchmark of bench/README.md on real sandboxes, in one run.
// Writes bench/results.json and prints a Markdown table. Nothing here asserts a time limit.
import 'reflect-metadata';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import {
  createReadStream,
  createWriteStream,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { cpus, freemem, release, tmpdir, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import {
  Sandbox,
  type SandboxCreateOptions,
  Secret,
  Template,
  Templates,
  Volume,
} from 'abx-sandbox';
import { Client, type Dispatcher, Pool } from 'undici';
import { openSqlite } from '../src/control/sqlite.js';
import { unmountUnder } from '../src/providers/local/volumes.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../test/helpers/internet.js';
import { BenchCommands } from './commands.js';
import { deepagentsSearch } from './deepagents-search.js';
import { median, round, type Summary, summarize, throughput, timeEach } from './stats.js';
import { webhookCost } from './webhooks.js';
import { workspaceMount } from './workspace.js';

const QUICK = process.argv.includes('--quick');
/** `--only hops,transfers`: run just these sections (names as in main()), for working on one. */
const onlyArg = process.argv.indexOf('--only');
const ONLY = onlyArg >= 0 ? new Set((process.argv[onlyArg + 1] ?? '').split(',')) : undefined;
const runs = (section: string) => !ONLY || ONLY.has(section);
// bench/build/bench/run.js: the package is three folders up.
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const HOME = mkdtempSync(join(tmpdir(), 'abx-bench-'));
process.env.ABX_HOME = HOME;
const scale = (full: number, quick: number) => (QUICK ? quick : full);
/**
 * Calls of each kind made before the E2B figures are sampled (see `e2b`): `run` (a login shell,
 * about 25 ms a call), and the others (a millisecond or two).
 */
const E2B_WARM = { run: scale(150, 30), other: scale(1000, 60) };

const results: Record<string, unknown> = {
  startedAt: new Date().toISOString(),
  quick: QUICK,
  machine: {
    cpu: cpus()[0]?.model,
    cores: cpus().length,
    memoryGiB: round(totalmem() / 1024 ** 3, 1),
    freeMemoryGiB: round(freemem() / 1024 ** 3, 1),
    kernel: release(),
    node: process.version,
  },
};
const table: string[][] = [];
const row = (benchmark: string, figure: string, value: string, note = '') =>
  table.push([benchmark, figure, value, note]);
const ms = (s: Summary) => `p50 ${round(s.p50, 3)} ms · p99 ${round(s.p99, 3)} ms`;

/**
 * The headline figures, each under a stable key of results.json (top level) with its goal:
 * `atLeast` or `atMost` the target. Printed as a table of their own after the run.
 */
interface Goal {
  key: string;
  figure: string;
  value: number;
  unit: string;
  target: number;
  atLeast: boolean;
}
const goals: Goal[] = [];
function goal(
  key: string,
  figure: string,
  value: number,
  unit: string,
  target: number,
  atLeast: boolean,
) {
  // Ratios (no unit) keep a third decimal.
  const rounded = round(value, unit === '' ? 3 : 2);
  goals.push({ key, figure, value: rounded, unit, target, atLeast });
  results[key] = rounded;
}
const met = (g: Goal) => (g.atLeast ? g.value >= g.target : g.value <= g.target);
const benchStarted = performance.now();
const log = (text: string) =>
  process.stderr.write(
    `bench [${Math.round((performance.now() - benchStarted) / 1000)}s]: ${text}\n`,
  );

const children: ChildProcess[] = [];

/** Starts a host process that prints `{"event":"listening","port":N}` and returns the port. */
function startListening(command: string, args: string[], env: NodeJS.ProcessEnv = process.env) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit'], env });
  children.push(child);
  return new Promise<{ port: number; pid: number }>((resolve, reject) => {
    let buffer = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      buffer += chunk.toString();
      const line = buffer.split('\n').find((l) => l.includes('"listening"'));
      if (line) resolve({ port: JSON.parse(line).port, pid: child.pid as number });
    });
    child.once('exit', (code) => reject(new Error(`${command} exited (${code}) before listening`)));
  });
}

function rssMiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return round(Number(/VmRSS:\s+(\d+)/.exec(status)?.[1]) / 1024, 1);
}

/** RSS of the node process inside the sandbox that runs `/opt/abx/<script>` (envd.cjs...). */
async function sandboxRssMiB(sandbox: Sandbox, script: string): Promise<number> {
  // Compares argv[1] exactly: a pattern over whole command lines would match this loop itself.
  const { stdout } = await sandbox.commands.run(
    `for p in /proc/[0-9]*; do [ "$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | sed -n 2p)" = /opt/abx/${script} ] && grep VmRSS $p/status; done | head -1`,
  );
  return round(Number(/(\d+)/.exec(stdout)?.[1]) / 1024, 1);
}

/** VmRSS and the private pages (what the process itself adds: USS) of a sandbox process, MiB. */
async function sandboxPidMemory(
  sandbox: Sandbox,
  pid: number,
): Promise<{ rssMiB: number; privateMiB: number }> {
  const { stdout } = await sandbox.commands.run(
    `grep -E '^VmRSS' /proc/${pid}/status; grep -E '^Private_(Clean|Dirty)' /proc/${pid}/smaps_rollup`,
  );
  const kib = (name: RegExp) =>
    stdout
      .split('\n')
      .filter((line) => name.test(line))
      .reduce((sum, line) => sum + Number(/(\d+)/.exec(line)?.[1] ?? Number.NaN), 0);
  return {
    rssMiB: round(kib(/^VmRSS/) / 1024, 1),
    privateMiB: round(kib(/^Private_/) / 1024, 1),
  };
}

/** The OS pid of the command server on `port` of a sandbox, from envd's process list. */
async function serverOsPid(sandbox: Sandbox, port = 8080): Promise<number> {
  const server = (await sandbox.commands.list()).find(
    (p) => p.running && p.cmd.includes(`--port ${port} `),
  );
  if (!server?.osPid) throw new Error(`bench: no command server runs on port ${port}`);
  return server.osPid;
}

/** One JSON request to a sandbox's envd through the gateway (routes the SDK has no call for). */
async function envdJson<T>(sandbox: Sandbox, method: 'GET' | 'POST', path: string): Promise<T> {
  const gateway = new Client(daemonInfo().gatewayUrl);
  try {
    const res = await gateway.request({
      path,
      method,
      headers: {
        'x-sandbox-id': sandbox.sandboxId,
        'x-sandbox-port': '49983',
        'x-access-token': sandbox.accessToken,
        ...(method === 'POST' ? { 'content-type': 'application/json' } : {}),
      },
      ...(method === 'POST' ? { body: '{}' } : {}),
    });
    const text = await res.body.text();
    if (res.statusCode !== 200)
      throw new Error(`bench: ${method} ${path}: ${res.statusCode} ${text}`);
    return JSON.parse(text) as T;
  } finally {
    await gateway.close();
  }
}

/** The idle pre-started command server process of a sandbox, started and ready: its OS pid. */
async function idleServerPid(sandbox: Sandbox): Promise<number> {
  const { idle } = await envdJson<{ idle: { pid: number; ready: boolean } | null }>(
    sandbox,
    'POST',
    '/exec/server/prestart',
  );
  if (!idle?.ready) throw new Error('bench: envd has no idle command server process ready');
  return idle.pid;
}

function daemonInfo(): { pid: number; gatewayUrl: string } {
  return JSON.parse(readFileSync(join(HOME, 'daemon.json'), 'utf8'));
}

async function callLatency(sandbox: Sandbox) {
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
  goal('commandsRunP50Ms', "commands.run('true') p50", run.p50, 'ms', 3, false);
  goal('filesWriteP50Ms', 'files.write of 2 bytes p50', write.p50, 'ms', 2, false);
  row('1 call latency', "commands.run('true')", ms(run), 'goal p50 ≤ 3 ms');
  row('1 call latency', 'files.write of 2 bytes', ms(write), 'goal p50 ≤ 2 ms');
  row('1 call latency', 'server.call (gateway)', ms(server));
  row('1 call latency', 'files.write + commands.run', ms(source));
  row('1 call latency', 'source delivery / server', `${round(ratio, 1)}×`, 'goal ≥ 20×');
}

/** The sandbox's envd socket on the host, from the daemon's registry: the direct hop's target. */
function envdSocketOf(sandboxId: string): string {
  const db = openSqlite(join(HOME, 'abx.db'), { readOnly: true });
  try {
    const row = db.prepare('SELECT handle FROM sandboxes WHERE id = ?').get(sandboxId) as
      | { handle: string }
      | undefined;
    if (!row) throw new Error(`bench: sandbox ${sandboxId} is not in the registry`);
    return JSON.parse(row.handle).envdSocket;
  } finally {
    db.close();
  }
}

/**
 * Where the time of `commands.run('true')` and of a 2-byte `files.write` goes: the same request
 * at each hop from the process up to the SDK, interleaved (one call of each per round) so that
 * noise falls on all of them alike. Each figure includes the ones below it.
 */
async function hops(sandbox: Sandbox) {
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

async function callThroughput(sandbox: Sandbox, serverToken: string) {
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
  );
  goal(
    'directShareOfFloorC32',
    'command server direct throughput over the floor, c=32 (ratio 0–1)',
    share('direct', 32),
    '',
    0.8,
    true,
  );
  goal('vsPythonC1', 'command server vs the Python reference, c=1', vsPython(1), '×', 1.5, true);
  goal('vsPythonC32', 'command server vs the Python reference, c=32', vsPython(32), '×', 5, true);
  const one = (name: string) => figures[name]?.[1]?.latency.p50 ?? Number.NaN;
  const gatewayCost = one('gateway') - one('direct');
  results.gatewayCostMs = round(gatewayCost, 3);
  row('3 gateway cost', 'p50 at c=1: gateway − direct', `${round(gatewayCost, 3)} ms per call`);
}

async function lifecycle(template: string) {
  log('sandbox create → first command → kill');
  const created: number[] = [];
  const killed: number[] = [];
  for (let i = 0; i < scale(50, 10); i++) {
    const t0 = performance.now();
    const sandbox = await Sandbox.create({ template });
    await sandbox.commands.run('true');
    created.push(performance.now() - t0);
    const t1 = performance.now();
    await sandbox.kill();
    killed.push(performance.now() - t1);
  }
  /** 20 creates at once, each with its first command; the wall time and each one's. */
  const burst = async () => {
    const t = performance.now();
    const many = await Promise.all(
      Array.from({ length: 20 }, async () => {
        const t0 = performance.now();
        const sandbox = await Sandbox.create({ template });
        await sandbox.commands.run('true');
        return { sandbox, ms: performance.now() - t0 };
      }),
    );
    const wall = performance.now() - t;
    await Promise.all(many.map(({ sandbox }) => sandbox.kill()));
    return { wall, each: summarize(many.map((m) => m.ms)) };
  };
  // The first burst finds the pool a sequential stream of creates left (one or two sandboxes);
  // the second one comes after the pool grew to the first (up to ABX_WARM_POOL) and refilled.
  const first = await burst();
  const pool = await poolSize(template);
  const again = await burst();
  const wall = first.wall;
  results.lifecycle = {
    createToFirstCommand: summarize(created),
    kill: summarize(killed),
    concurrent20: { wallMs: round(wall, 1), each: first.each },
    concurrent20Again: { wallMs: round(again.wall, 1), each: again.each, pooledBefore: pool },
  };
  goal(
    'createToFirstCommandP50Ms',
    'create → first command done p50 (warm pool)',
    summarize(created).p50,
    'ms',
    10,
    false,
  );
  goal('concurrent20WallMs', '20 creates at once, wall', wall, 'ms', 500, false);
  row('4 lifecycle', 'create → first command done', ms(summarize(created)), 'goal p50 ≤ 10 ms');
  row('4 lifecycle', 'kill', ms(summarize(killed)));
  row(
    '4 lifecycle',
    '20 creates at once',
    `${round(wall, 0)} ms wall, each ${ms(first.each)}`,
    'goal wall ≤ 500 ms',
  );
  row(
    '4 lifecycle',
    '20 creates at once, again',
    `${round(again.wall, 0)} ms wall, each ${ms(again.each)}`,
    `${pool} waited in the pool (it grows to a burst, up to ABX_WARM_POOL)`,
  );
}

/** The host's busy and total CPU time so far, in clock ticks (the first line of /proc/stat). */
function hostCpuTicks(): { busy: number; total: number } {
  const fields = (readFileSync('/proc/stat', 'utf8').split('\n')[0] as string)
    .trim()
    .split(/\s+/)
    .slice(1)
    .map(Number);
  const total = fields.reduce((sum, n) => sum + n, 0);
  // idle and iowait are the 4th and 5th.
  return { busy: total - (fields[3] ?? 0) - (fields[4] ?? 0), total };
}

/** The share (0-1) of the host's CPU busy during `ms` from now. */
async function hostBusyShare(ms: number): Promise<number> {
  const before = hostCpuTicks();
  await new Promise((resolve) => setTimeout(resolve, ms));
  const after = hostCpuTicks();
  return (after.busy - before.busy) / Math.max(1, after.total - before.total);
}

/**
 * The CPU time (ms) the processes of some local sandboxes used so far: the members of each one's
 * pids cgroup (a root daemon's), from /proc. Other load on the host does not count.
 */
function sandboxesCpuMs(ids: readonly string[]): number {
  let total = 0;
  for (const id of ids) {
    let pids: string[] = [];
    try {
      pids = readFileSync(`/sys/fs/cgroup/pids/abx/${id}/cgroup.procs`, 'utf8').split('\n');
    } catch {
      // not a root daemon's local sandbox
    }
    for (const pid of pids) if (pid) total += cpuMs(Number(pid));
  }
  return total;
}

/** The share (0-1) of the host's cores the processes of `ids` used during `ms` from now. */
async function sandboxesCpuShare(ids: readonly string[], ms: number): Promise<number> {
  const before = sandboxesCpuMs(ids);
  await new Promise((resolve) => setTimeout(resolve, ms));
  return (sandboxesCpuMs(ids) - before) / (ms * cpus().length);
}

/**
 * {@link memAvailable} once it stops growing after memory was freed (a 2 s window within 1% of
 * `held`, at most 15 s). Also the reading after 1 s.
 */
async function settledMemAvailable(
  held: number,
): Promise<{ value: number; atOneSecond: number; ms: number }> {
  const readings: number[] = [];
  const start = performance.now();
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 500));
    readings.push(memAvailable());
    const window = readings.slice(-5);
    const grew = (window.at(-1) as number) - (window[0] as number);
    if (window.length === 5 && grew < 0.01 * Math.max(1, held)) break;
    if (performance.now() - start > 15_000) break;
  }
  return {
    value: Math.max(...readings),
    atOneSecond: readings[1] as number,
    ms: performance.now() - start,
  };
}

/** A field of /proc/meminfo (`MemAvailable`, `AnonPages`...), in bytes. */
function meminfo(field: string): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(
    readFileSync('/proc/meminfo', 'utf8'),
  );
  return Number(match?.[1] ?? 0) * 1024;
}
/**
 * Free pages the kernel keeps in its per-CPU lists (`count:` of each pageset in /proc/zoneinfo),
 * in bytes. Linux 6.7+ tunes those lists' size to what a CPU frees: when a sandbox's processes
 * end, hundreds of MiB wait there, free to any allocation but counted in neither MemFree nor
 * MemAvailable, and drain into the free lists over about 30 s.
 */
function perCpuFreeBytes(): number {
  const zoneinfo = readFileSync('/proc/zoneinfo', 'utf8');
  let pages = 0;
  for (const match of zoneinfo.matchAll(/\n\s+count:\s+(\d+)/g)) pages += Number(match[1]);
  return pages * 4096;
}
/** MemAvailable and the free pages of the per-CPU lists: what a new allocation could get. */
const memAvailable = () => meminfo('MemAvailable') + perCpuFreeBytes();

/**
 * Pause and resume (docs/lifecycle.md): a freeze and its resume, a hibernate and the resume to
 * the first command after it against a cold create (no warm pool: the same network, started
 * afresh) to its first command; then 20 busy sandboxes frozen (the host's CPU they used) and 20
 * holding 64 MiB each hibernated (the host's MemAvailable they give back).
 */
async function pauses(template: string) {
  log('pause, resume, hibernate');
  const rounds = scale(20, 5);
  const frozen: number[] = [];
  const thawed: number[] = [];
  const hibernated: number[] = [];
  const woken: number[] = [];
  const cold: number[] = [];
  const box = await Sandbox.create({ template, timeoutMs: 1_800_000 });
  try {
    await box.commands.start('i=0; while :; do i=$((i+1)); sleep 0.05; done');
    await box.files.write('kept.txt', 'kept');
    for (let i = 0; i < rounds; i++) {
      let t = performance.now();
      await box.pause();
      frozen.push(performance.now() - t);
      t = performance.now();
      await box.resume();
      thawed.push(performance.now() - t);
      t = performance.now();
      await box.pause({ memory: false });
      hibernated.push(performance.now() - t);
      t = performance.now();
      await box.resume();
      await box.commands.run('true');
      woken.push(performance.now() - t);
      // A cold create of the same network, interleaved so noise falls on both alike.
      t = performance.now();
      const fresh = await Sandbox.create({ template, network: { allowOut: [], denyOut: [] } });
      await fresh.commands.run('true');
      cold.push(performance.now() - t);
      await fresh.kill();
    }
  } finally {
    await box.kill();
  }
  const [pause, resume, hibernate, wake, coldCreate] = [
    frozen,
    thawed,
    hibernated,
    woken,
    cold,
  ].map(summarize) as [Summary, Summary, Summary, Summary, Summary];

  // 20 sandboxes, each a busy loop: the host's CPU with them running, then frozen. Started
  // afresh (a network of their own), so that no pool refill runs on the host meanwhile.
  const afresh = () =>
    Sandbox.create({ template, timeoutMs: 1_800_000, network: { allowOut: [], denyOut: [] } });
  const many = await Promise.all(Array.from({ length: 20 }, afresh));
  let busyRunning = 0;
  let busyFrozen = 0;
  let ownRunning = 0;
  let ownFrozen = 0;
  let memRecovered = 0;
  let memRecoveredAtOneSecond = 0;
  let memAfterOneSecond = 0;
  let memSettleMs = 0;
  let memRecoveredByPlainProcesses = 0;
  let anonRecovered = 0;
  let heldMiB = 0;
  try {
    await Promise.all(many.map((s) => s.commands.start('while :; do :; done')));
    // The pool's refills after 20 creates are done first: they would count as the host's.
    await poolSize(template);
    const ids = many.map((s) => s.sandboxId);
    [ownRunning, busyRunning] = await Promise.all([
      sandboxesCpuShare(ids, 2000),
      hostBusyShare(2000),
    ]);
    await Promise.all(many.map((s) => s.pause()));
    [ownFrozen, busyFrozen] = await Promise.all([
      sandboxesCpuShare(ids, 2000),
      hostBusyShare(2000),
    ]);
    await Promise.all(many.map((s) => s.kill()));
    // 20 holding 64 MiB each, once all hold it (a marker file says so): then hibernated.
    const holders = await Promise.all(Array.from({ length: 20 }, afresh));
    many.splice(0, many.length, ...holders);
    await poolSize(template);
    const before = memAvailable();
    const anonBefore = meminfo('AnonPages');
    await Promise.all(
      holders.map(async (s) => {
        await s.commands.start(
          `python3 -c "b = bytearray(64 << 20); open('/tmp/held', 'w').write('1'); import time; time.sleep(3600)"`,
        );
        await s.commands.run('while [ ! -f /tmp/held ]; do sleep 0.05; done', {
          timeoutMs: 60_000,
        });
      }),
    );
    const holding = memAvailable();
    const anonHolding = meminfo('AnonPages');
    await Promise.all(holders.map((s) => s.pause({ memory: false })));
    const settled = await settledMemAvailable(before - holding);
    memSettleMs = settled.ms;
    memAfterOneSecond = settled.atOneSecond;
    const after = settled.value;
    anonRecovered = (anonHolding - meminfo('AnonPages')) / Math.max(1, anonHolding - anonBefore);
    heldMiB = (before - holding) / 1024 ** 2;
    memRecovered = (after - holding) / Math.max(1, before - holding);
    memRecoveredAtOneSecond = (memAfterOneSecond - holding) / Math.max(1, before - holding);
    // The baseline of the same run: 20 plain host processes holding 64 MiB each, killed. What
    // this VM gives back to MemAvailable for them is what it can give back for any process.
    await Promise.all(many.map((s) => s.kill()));
    many.splice(0);
    const hostBefore = memAvailable();
    const plain = Array.from({ length: 20 }, () =>
      spawn(
        'python3',
        ['-c', 'b = bytearray(64 << 20); print(1, flush=True); import time; time.sleep(600)'],
        {
          stdio: ['ignore', 'pipe', 'ignore'],
        },
      ),
    );
    children.push(...plain);
    await Promise.all(
      plain.map((child) => new Promise((resolve) => child.stdout?.once('data', resolve))),
    );
    const hostHolding = memAvailable();
    for (const child of plain) child.kill('SIGKILL');
    const hostSettled = await settledMemAvailable(hostBefore - hostHolding);
    memRecoveredByPlainProcesses =
      (hostSettled.value - hostHolding) / Math.max(1, hostBefore - hostHolding);
  } finally {
    await Promise.all(many.map((s) => s.kill()));
  }
  results.pauses = {
    pause,
    resume,
    hibernate,
    resumeFromHibernateToFirstCommand: wake,
    coldCreateToFirstCommand: coldCreate,
    hostCpuBusy20Running: round(busyRunning, 3),
    hostCpuBusy20Frozen: round(busyFrozen, 3),
    sandboxesCpu20Running: round(ownRunning, 3),
    sandboxesCpu20Frozen: round(ownFrozen, 3),
    memHeldBy20MiB: round(heldMiB, 0),
    memRecoveredByHibernate20: round(memRecovered, 3),
    memRecoveredByHibernate20AtOneSecond: round(memRecoveredAtOneSecond, 3),
    memSettleMs: round(memSettleMs, 0),
    memRecoveredByKilling20PlainProcesses: round(memRecoveredByPlainProcesses, 3),
    anonRecoveredByHibernate20: round(anonRecovered, 3),
  };
  goal(
    'resumeFromHibernateToFirstCommandP50Ms',
    'resume from hibernate → first command p50 (goal: ≤ a cold create → first command, same run)',
    wake.p50,
    'ms',
    round(coldCreate.p50, 1),
    false,
  );
  goal(
    'hibernate20MemRecoveredShare',
    'MemAvailable and per-CPU free pages given back by hibernating 20 sandboxes holding 64 MiB each (share)',
    memRecovered,
    '',
    0.9,
    true,
  );
  results.pauseP50Ms = round(pause.p50, 2);
  results.resumeP50Ms = round(resume.p50, 2);
  results.hibernateP50Ms = round(hibernate.p50, 2);
  row('13 pause', 'pause (freeze)', ms(pause));
  row('13 pause', 'resume (thaw)', ms(resume));
  row('13 pause', 'hibernate', ms(hibernate), 'the processes end, the disk stays');
  row('13 pause', 'resume from hibernate → first command', ms(wake), 'goal p50 ≤ a cold create');
  row('13 pause', 'cold create → first command (same network, no pool)', ms(coldCreate));
  row(
    '13 pause',
    "CPU of 20 sandboxes' busy loops: running → frozen",
    `${round(ownRunning * 100, 1)}% → ${round(ownFrozen * 100, 1)}% of the host's cores`,
    `their own processes, 2 s each; the whole host (the daemon, other load): ${round(busyRunning * 100, 1)}% → ${round(busyFrozen * 100, 1)}%`,
  );
  row(
    '13 pause',
    'MemAvailable (+ per-CPU free lists) given back by hibernating 20 sandboxes',
    `${round(memRecovered * 100, 1)}% of ${round(heldMiB, 0)} MiB`,
    `goal ≥ 90%; 20 plain host processes of 64 MiB killed give back ${round(memRecoveredByPlainProcesses * 100, 1)}% (${round(memRecovered / Math.max(0.001, memRecoveredByPlainProcesses), 2)}× that); once it stopped growing (${round(memSettleMs / 1000, 1)} s; ${round(memRecoveredAtOneSecond * 100, 1)}% after 1 s); the processes' memory (AnonPages) given back: ${round(anonRecovered * 100, 1)}%`,
  );
}

/**
 * Fork (issue 29): `sandbox.fork()` → first command done in the fork, of a sandbox with 100 MiB
 * of random bytes in its home (nothing for a sparse copy to skip) and of one with an empty home,
 * against create → first command of the same template (the warm pool serves it: what a user
 * gets), one of each per round so noise falls on all alike. Each fork and sandbox is killed
 * after its round, off the clock.
 */
async function fork(template: string) {
  log('fork → first command, 100 MiB home and empty, against create');
  const full = await Sandbox.create({ template });
  const empty = await Sandbox.create({ template });
  try {
    await full.commands.run('head -c 100M /dev/urandom > ~/data.bin && sync');
    const times = {
      full: [] as number[],
      empty: [] as number[],
      create: [] as number[],
      cold: [] as number[],
    };
    const createOnce = async (into: number[], options: SandboxCreateOptions) => {
      const t0 = performance.now();
      const box = await Sandbox.create({ template, ...options });
      await box.commands.run('true');
      into.push(performance.now() - t0);
      await box.kill();
    };
    const forkOnce = async (source: Sandbox, into: number[]) => {
      const t0 = performance.now();
      const [box] = await source.fork();
      await box?.commands.run('true');
      into.push(performance.now() - t0);
      await box?.kill();
    };
    for (let i = 0; i < scale(20, 5); i++) {
      await forkOnce(full, times.full);
      await forkOnce(empty, times.empty);
      await createOnce(times.create, {});
      // A network policy of its own: the pool cannot serve it, the sandbox starts afresh (as a
      // fork does), on the internet network the template gives too.
      await createOnce(times.cold, { network: { allowOut: [], denyOut: [] } });
    }
    const [f, e, c] = [summarize(times.full), summarize(times.empty), summarize(times.create)];
    const cold = summarize(times.cold);
    results.fork = { home100MiB: f, emptyHome: e, create: c, coldCreate: cold };
    results.forkP50Ms = round(f.p50, 1);
    row(
      '12 fork',
      'fork → first command, 100 MiB in home',
      ms(f),
      `${round(f.p50 / c.p50, 1)}× create p50`,
    );
    row(
      '12 fork',
      'fork → first command, empty home',
      ms(e),
      `${round(e.p50 / c.p50, 1)}× create p50`,
    );
    row('12 fork', 'create → first command (same rounds)', ms(c), 'the warm pool serves creates');
    row(
      '12 fork',
      'cold create → first command (same rounds)',
      ms(cold),
      `started afresh, as a fork is; fork of 100 MiB = ${round(f.p50 / cold.p50, 1)}× this`,
    );
  } finally {
    await full.kill();
    await empty.kill();
  }
}

/**
 * Volumes (issue 29): making and removing a 1 GiB volume, and what mounting one costs a create:
 * cold create → first command with one volume and without (both with a network policy of their
 * own, so neither comes from the warm pool), one of each per round. Then 64 MiB written and
 * synced to the volume against the same to the sandbox's own home.
 */
async function volumes(template: string) {
  log('volumes: create and remove, a create that mounts one, writes');
  const times = {
    make: [] as number[],
    remove: [] as number[],
    plain: [] as number[],
    mounted: [] as number[],
  };
  const name = 'bench-volume';
  const own = { network: { allowOut: [], denyOut: [] } };
  const made = await Volume.create(name, { size: '1G' });
  try {
    for (let i = 0; i < scale(10, 3); i++) {
      const t0 = performance.now();
      const volume = await Volume.create(`${name}-${i}`, { size: '1G' });
      times.make.push(performance.now() - t0);
      const t1 = performance.now();
      await volume.remove();
      times.remove.push(performance.now() - t1);
    }
    for (let i = 0; i < scale(20, 5); i++) {
      for (const [into, mounts] of [
        [times.plain, []],
        [times.mounted, [{ name, path: '/mnt/data' }]],
      ] as const) {
        const t0 = performance.now();
        const box = await Sandbox.create({ template, ...own, volumeMounts: [...mounts] });
        await box.commands.run('true');
        into.push(performance.now() - t0);
        await box.kill();
      }
    }
    const box = await Sandbox.create({ template, volumeMounts: [{ name, path: '/mnt/data' }] });
    const write = { volume: [] as number[], home: [] as number[] };
    try {
      for (let i = 0; i < scale(5, 2); i++) {
        for (const [into, dir] of [
          [write.volume, '/mnt/data'],
          [write.home, '~'],
        ] as const) {
          const t0 = performance.now();
          await box.commands.run(
            `head -c 64M /dev/zero > ${dir}/w && sync ${dir}/w && rm ${dir}/w`,
          );
          into.push(performance.now() - t0);
        }
      }
    } finally {
      await box.kill();
    }
    const [mk, rm, plain, mounted] = [times.make, times.remove, times.plain, times.mounted].map(
      summarize,
    ) as Summary[];
    const [wv, wh] = [summarize(write.volume), summarize(write.home)];
    results.volumes = {
      create: mk,
      remove: rm,
      coldCreate: plain,
      coldCreateWithVolume: mounted,
      write64MiBVolume: wv,
      write64MiBHome: wh,
    };
    row(
      '14 volumes',
      'Volume.create (1 GiB)',
      ms(mk),
      'a sparse ext4 image, formatted and mounted (root daemon)',
    );
    row('14 volumes', 'Volume.remove', ms(rm), 'unmounted, then its folder removed');
    row(
      '14 volumes',
      'cold create → first command, one volume',
      ms(mounted),
      `${round(mounted.p50 / plain.p50, 2)}× the same without`,
    );
    row(
      '14 volumes',
      'cold create → first command, no volume (same rounds)',
      ms(plain),
      'a network policy of its own: never from the pool',
    );
    row(
      '14 volumes',
      'write + sync 64 MiB to the volume',
      ms(wv),
      `${round(wv.p50 / wh.p50, 2)}× the same to its home`,
    );
  } finally {
    await made.remove().catch(() => false);
  }
}

/** Sandboxes of a template waiting in the warm pool, once its refills are done (up to 10 s). */
async function poolSize(template: string): Promise<number> {
  let last = -1;
  for (let waited = 0; waited < 10_000; waited += 250) {
    const n = (await Sandbox.list({ state: 'pooled', template })).length;
    if (n === last) return n;
    last = n;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return last;
}

/**
 * Host pids of the processes inside a local sandbox (below its bwrap, which carries the sandbox
 * id as `--hostname`) whose command line `matches`.
 */
function sandboxPids(sandboxId: string, matches: (argv: string[]) => boolean): number[] {
  const parents = new Map<number, number>();
  const argvs = new Map<number, string[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      argvs.set(Number(entry), readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0'));
    } catch {
      // ended meanwhile
    }
  }
  const inSandbox = (pid: number): boolean => {
    for (let at = pid; at > 1; at = parents.get(at) ?? 0) {
      const argv = argvs.get(at) ?? [];
      const i = argv.indexOf('--hostname');
      if (argv[0]?.endsWith('bwrap') && i > 0 && argv[i + 1] === sandboxId) return true;
    }
    return false;
  };
  return [...argvs].filter(([pid, argv]) => matches(argv) && inSandbox(pid)).map(([pid]) => pid);
}

/**
 * Whether a sandbox (local provider) has envd's idle `server.cjs --prestart` process ready:
 * waiting in `read(0, ...)` for its command line (x86-64's syscall 0 on fd 0).
 */
function hasIdleServer(sandboxId: string): boolean {
  const waitingOnStdin = (pid: number) => {
    try {
      return readFileSync(`/proc/${pid}/syscall`, 'utf8').startsWith('0 0x0 ');
    } catch {
      return false;
    }
  };
  return sandboxPids(
    sandboxId,
    (argv) => argv[1] === '/opt/abx/server.cjs' && argv[2] === '--prestart',
  ).some(waitingOnStdin);
}

/** The host pid of a local sandbox's envd. */
function envdPidOf(sandboxId: string): number {
  const [pid] = sandboxPids(sandboxId, (argv) => argv[1] === '/opt/abx/envd.cjs');
  if (!pid) throw new Error(`bench: no envd process found in sandbox ${sandboxId}`);
  return pid;
}

/**
 * Waits until the warm pool of a template holds a sandbox again, its refills are done, and each
 * has its idle command server process (the pool starts it once a sandbox waited unclaimed).
 */
async function poolRefilled(template: string): Promise<void> {
  for (let waited = 0; waited < 30_000; waited += 100) {
    const pooled = await Sandbox.list({ state: 'pooled', template });
    if (pooled.length > 0 && pooled.every((s) => hasIdleServer(s.sandboxId))) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await poolSize(template);
}

/**
 * `server.start()` (issue 31): a restart of the same classes on a running sandbox, one a second
 * (envd has its next idle process ready by then); a bundle new to the sandbox on one fresh from the
 * warm pool, whose idle process waits for it; and create → start → first call answered, the
 * whole of what a script does first, with the pool warm (refilled, idle processes ready, between
 * rounds). Beside them
 * the same new-bundle start on a sandbox that has no idle process (a network policy of its own:
 * not from the pool), so the first start runs Node afresh as every start did before.
 */
async function serverStart(sandbox: Sandbox, template: string) {
  log('server.start');
  const pause = () => new Promise((resolve) => setTimeout(resolve, 1000));
  const warm: number[] = [];
  for (let i = 0; i < scale(10, 3) + 1; i++) {
    await pause();
    const t0 = performance.now();
    await sandbox.server.start({ commands: [BenchCommands], restart: true });
    if (i > 0) warm.push(performance.now() - t0);
  }
  const newBundle: number[] = [];
  const firstCall: number[] = [];
  const cold: number[] = [];
  const prestarted: boolean[] = [];
  for (let i = 0; i < scale(15, 4); i++) {
    await poolRefilled(template);
    const t0 = performance.now();
    const box = await Sandbox.create({ template });
    const t1 = performance.now();
    await box.server.start({ commands: [BenchCommands] });
    const t2 = performance.now();
    await box.server.call('add', { x: i });
    const t3 = performance.now();
    newBundle.push(t2 - t1);
    firstCall.push(t3 - t0);
    const state = JSON.parse(await box.files.read('/home/user/.abx/server/server-8080.json'));
    prestarted.push(state.prestarted === true);
    await box.kill();
    const plain = await Sandbox.create({ template, network: { allowOut: [], denyOut: [] } });
    try {
      await plain.commands.run('true');
      const t4 = performance.now();
      await plain.server.start({ commands: [BenchCommands] });
      cold.push(performance.now() - t4);
    } finally {
      await plain.kill();
    }
  }
  const [w, n, f, c] = [warm, newBundle, firstCall, cold].map(summarize) as Summary[];
  results.serverStart = {
    restartSameBundle: w,
    newBundlePooled: n,
    createToFirstCall: f,
    newBundleNoIdleProcess: c,
    startsInIdleProcess: prestarted.filter(Boolean).length,
    starts: prestarted.length,
  };
  goal(
    'serverStartWarmP50Ms',
    'server.start() p50, restart of the same classes (1 s apart)',
    w.p50,
    'ms',
    150,
    false,
  );
  goal(
    'serverStartNewBundleP50Ms',
    'server.start() p50, classes new to a sandbox from the warm pool',
    n.p50,
    'ms',
    50,
    false,
  );
  goal(
    'createToFirstCallP50Ms',
    'Sandbox.create() → server.start() → first call answered p50 (warm pool)',
    f.p50,
    'ms',
    60,
    false,
  );
  row('5 server.start', 'restart, same classes (1 s apart)', ms(w), 'goal p50 ≤ 150 ms');
  row(
    '5 server.start',
    'new bundle, sandbox from the pool',
    ms(n),
    `goal p50 ≤ 50 ms; ${prestarted.filter(Boolean).length} of ${prestarted.length} in the idle process`,
  );
  row('5 server.start', 'create → start → first call answered', ms(f), 'goal p50 ≤ 60 ms');
  row(
    '5 server.start',
    'new bundle, sandbox with no idle process (not from the pool)',
    ms(c),
    `Node started afresh: ${round(c.p50 / n.p50, 1)}× the pooled start`,
  );
}

async function transfers(sandbox: Sandbox) {
  log('upload / download');
  const sizes = [1, 256];
  const figures: Record<string, number> = {};
  const dir = mkdtempSync(join(HOME, 'transfer-'));
  for (const mib of sizes) {
    const data = Buffer.alloc(mib * 1024 * 1024, 7);
    const file = join(dir, `data-${mib}.bin`);
    writeFileSync(file, data);
    const rate = (seconds: number) => round(mib / seconds, 1);
    const time = async (fn: () => Promise<unknown>) => {
      const samples = await timeEach(mib > 8 ? 3 : 10, fn, 1);
      return median(samples) / 1000;
    };
    figures[`cp ${mib} MiB`] = rate(
      await time(async () => {
        spawnSync('cp', [file, `${file}.copy`]);
      }),
    );
    // File to file, as cp: a host file streamed into the sandbox, a sandbox file streamed into
    // a host file.
    figures[`envd upload ${mib} MiB`] = rate(
      await time(() =>
        sandbox.files.write('/tmp/up.bin', createReadStream(file, { highWaterMark: 1 << 20 })),
      ),
    );
    figures[`envd download ${mib} MiB`] = rate(
      await time(async () =>
        pipeline(
          (await sandbox.files.read('/tmp/up.bin', { format: 'stream' })) as Readable,
          createWriteStream(`${file}.down`),
        ),
      ),
    );
    // Memory to file and file to memory: a Buffer sent, the file read whole into a new buffer.
    figures[`envd upload from memory ${mib} MiB`] = rate(
      await time(() => sandbox.files.write('/tmp/up.bin', data)),
    );
    figures[`envd download to memory ${mib} MiB`] = rate(
      await time(() => sandbox.files.read('/tmp/up.bin', { format: 'bytes' })),
    );
    if (mib <= 32) {
      const content = data.toString('base64');
      figures[`server upload ${mib} MiB`] = rate(
        await time(() =>
          sandbox.server.call('upload', { path: '/tmp/up2.bin', content, encoding: 'base64' }),
        ),
      );
      figures[`server download ${mib} MiB`] = rate(
        await time(() => sandbox.server.call('download', { path: '/tmp/up2.bin' })),
      );
    }
  }
  rmSync(dir, { recursive: true, force: true });
  results.transfersMBps = figures;
  const ofCp = (name: string) =>
    (figures[`${name} 256 MiB`] ?? Number.NaN) / (figures['cp 256 MiB'] ?? Number.NaN);
  goal(
    'upload256ShareOfCp',
    "256 MiB upload file to file, over cp's speed (ratio 0–1)",
    ofCp('envd upload'),
    '',
    0.5,
    true,
  );
  goal(
    'download256ShareOfCp',
    "256 MiB download file to file, over cp's speed (ratio 0–1)",
    ofCp('envd download'),
    '',
    0.5,
    true,
  );
  for (const mib of sizes) {
    const f = (name: string) => figures[`${name} ${mib} MiB`];
    row(
      '6 transfers',
      `${mib} MiB: cp / envd up / envd down${mib <= 32 ? ' / server up / server down' : ''}`,
      `${[f('cp'), f('envd upload'), f('envd download'), f('server upload'), f('server download')].filter((v) => v !== undefined).join(' / ')} MiB/s`,
      `file to file: upload ${Math.round((100 * (f('envd upload') ?? 0)) / (f('cp') ?? 1))}%, download ${Math.round((100 * (f('envd download') ?? 0)) / (f('cp') ?? 1))}% of cp (goal ≥ 50%)`,
    );
    row(
      '6 transfers',
      `${mib} MiB: envd up from memory / down to memory`,
      `${f('envd upload from memory')} / ${f('envd download to memory')} MiB/s`,
    );
  }
}

/** A python3 -c per call, the deepagents Python reference's way: the request as JSON on stdin. */
function pythonPerCall(sandbox: Sandbox, script: string, request: unknown) {
  const quoted = `'${script.replaceAll("'", `'\\''`)}'`;
  return sandbox.commands.run(
    `python3 -c ${quoted} <<'__ABX_BENCH__'\n${JSON.stringify(request)}\n__ABX_BENCH__`,
  );
}

/** A tool call that must succeed: a failing one would time an error path instead. */
async function must<T extends { error?: string }>(call: Promise<T>): Promise<T> {
  const result = await call;
  if (result.error) throw new Error(`bench: ${result.error}`);
  return result;
}

/** Alternates an edit of one file between MARKER → REKRAM and back. */
function markerSwap(): () => [string, string] {
  let flip = false;
  return () => {
    flip = !flip;
    return flip ? ['MARKER', 'REKRAM'] : ['REKRAM', 'MARKER'];
  };
}

const PY_READ = `import sys, json
p = json.loads(sys.stdin.read())
with open(p['path']) as f: lines = f.read().splitlines()
print('\\n'.join(lines[p['offset']:p['offset'] + p['limit']]))`;
const PY_EDIT = `import sys, json
p = json.loads(sys.stdin.read())
with open(p['path']) as f: text = f.read()
n = text.count(p['old'])
if n != 1: sys.exit(1)
with open(p['path'], 'w') as f: f.write(text.replace(p['old'], p['new'], 1))
print(n)`;
const PY_GREP = `import sys, os, json
p = json.loads(sys.stdin.read())
out = []
for root, dirs, files in os.walk(p['path']):
    dirs.sort()
    for name in sorted(files):
        full = os.path.join(root, name)
        with open(full, errors='replace') as f:
            for i, line in enumerate(f, 1):
                if p['pattern'] in line: out.append({'path': full, 'line': i, 'text': line.rstrip('\\n')})
print(json.dumps(out))`;

/**
 * Issue 17: the file tools of a running sandbox, answered by envd (native), by a node program per
 * call through execute() (any BaseSandbox's way), and by a python3 -c per call (the deepagents
 * Python reference's way), on small everyday work; then the large cases, native and execute().
 */
async function agentTools(sandbox: Sandbox) {
  log('BaseSandbox: native vs execute() vs python3 -c per call');
  await sandbox.commands.run(
    `node -e "
      const fs = require('fs');
      fs.writeFileSync('big.txt', Array.from({ length: 100000 }, (_, i) => 'line ' + i).join('\\n'));
      fs.mkdirSync('tree', { recursive: true });
      for (let i = 0; i < 10000; i++) fs.writeFileSync('tree/f' + i + '.txt', i % 1000 === 0 ? 'needle here' : 'hay');
      fs.writeFileSync('ten.txt', 'x'.repeat(5 * 1024 * 1024) + 'MARKER' + 'y'.repeat(5 * 1024 * 1024));
      const code = Array.from({ length: 2000 }, (_, i) => '    value_' + i + ' = compute(' + i + ')  # step ' + i);
      fs.writeFileSync('page.py', code.join('\\n') + '\\n');
      fs.writeFileSync('small.py', code.slice(0, 200).join('\\n') + '\\nMARKER\\n');
      for (let d = 0; d < 10; d++) {
        fs.mkdirSync('small/d' + d, { recursive: true });
        for (let f = 0; f < 10; f++) fs.writeFileSync('small/d' + d + '/m' + f + '.py', code.slice(0, 30).join('\\n') + (f === 3 ? '\\nneedle = 1\\n' : '\\n'));
      }
    "`,
  );
  const page = { path: 'page.py', offset: 500, limit: 200 };
  const swapSmall = markerSwap();
  const swapLarge = markerSwap();
  const small = async (fileTools: Sandbox['fileTools'], n: number) => {
    sandbox.fileTools = fileTools;
    const read = summarize(
      await timeEach(n, () =>
        must(sandbox.read(page.path, { offset: page.offset, limit: page.limit })),
      ),
    );
    const edit = summarize(
      await timeEach(n, () => {
        const [from, to] = swapSmall();
        return must(sandbox.edit('small.py', from, to));
      }),
    );
    const grep = summarize(
      await timeEach(n, () => must(sandbox.grep('needle', { path: 'small' }))),
    );
    return { read, edit, grep };
  };
  const python = {
    read: summarize(await timeEach(scale(30, 8), () => pythonPerCall(sandbox, PY_READ, page), 3)),
    edit: summarize(
      await timeEach(
        scale(30, 8),
        () => {
          const [from, to] = swapSmall();
          return pythonPerCall(sandbox, PY_EDIT, { path: 'small.py', old: from, new: to });
        },
        3,
      ),
    ),
    grep: summarize(
      await timeEach(
        scale(30, 8),
        () => pythonPerCall(sandbox, PY_GREP, { path: 'small', pattern: 'needle' }),
        3,
      ),
    ),
  };
  const execute = await small('execute', scale(30, 8));
  const native = await small('native', scale(200, 30));
  const large = async (fileTools: Sandbox['fileTools']) => {
    sandbox.fileTools = fileTools;
    const read = summarize(
      await timeEach(scale(20, 5), () =>
        must(sandbox.read('big.txt', { offset: 50_000, limit: 2000 })),
      ),
    );
    const grep = summarize(
      await timeEach(scale(5, 2), () => must(sandbox.grep('needle', { path: 'tree' })), 1),
    );
    const edit = summarize(
      await timeEach(
        scale(5, 2),
        () => {
          const [from, to] = swapLarge();
          return must(sandbox.edit('ten.txt', from, to));
        },
        0,
      ),
    );
    return { read, grep, edit };
  };
  const largeExecute = await large('execute');
  const largeNative = await large('native');
  sandbox.fileTools = 'native';
  results.agentTools = {
    small: { native, execute, python },
    large: { native: largeNative, execute: largeExecute },
  };
  const trio = (pick: (x: { read: Summary; edit: Summary; grep: Summary }) => Summary) =>
    `${[native, execute, python].map((x) => round(pick(x).p50, 2)).join(' / ')} ms p50`;
  const faster = (pick: (x: { read: Summary; edit: Summary; grep: Summary }) => Summary) =>
    `native ${round(pick(execute).p50 / pick(native).p50, 0)}× faster than execute(), ${round(pick(python).p50 / pick(native).p50, 0)}× than python3 -c`;
  row(
    '7 BaseSandbox',
    'read 200-line page: native / execute() / python3 -c',
    trio((x) => x.read),
    `${faster((x) => x.read)}; goal native ≤ 5 ms`,
  );
  row(
    '7 BaseSandbox',
    'small edit: native / execute() / python3 -c',
    trio((x) => x.edit),
    `${faster((x) => x.edit)}; goal native ≤ 5 ms`,
  );
  row(
    '7 BaseSandbox',
    'grep 100 files: native / execute() / python3 -c',
    trio((x) => x.grep),
    `${faster((x) => x.grep)}; goal native ≤ 5 ms`,
  );
  const pair = (pick: (x: { read: Summary; edit: Summary; grep: Summary }) => Summary) =>
    `${round(pick(largeNative).p50, 1)} / ${round(pick(largeExecute).p50, 1)} ms p50`;
  row(
    '7 BaseSandbox',
    'read 2000 lines at offset 50 000 of 100 000: native / execute()',
    pair((x) => x.read),
  );
  row(
    '7 BaseSandbox',
    'grep over 10 000 files: native / execute()',
    pair((x) => x.grep),
  );
  row(
    '7 BaseSandbox',
    'edit of a 10 MiB file: native / execute()',
    pair((x) => x.edit),
  );
}

async function memory(template: string) {
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

/** True when a Docker engine answers on the default socket (images need one). */
function dockerAnswers(): boolean {
  return spawnSync('docker', ['info'], { stdio: 'ignore', timeout: 10_000 }).status === 0;
}

/** The first of these images the engine has, to build image templates from (no registry here). */
function localImage(): string | undefined {
  const wanted = process.env.ABX_BENCH_IMAGE
    ? [process.env.ABX_BENCH_IMAGE]
    : ['abx-test/debian:12', 'debian:bookworm-slim', 'debian:12-slim', 'python:3.12-slim'];
  return wanted.find(
    (image) => spawnSync('docker', ['image', 'inspect', image], { stdio: 'ignore' }).status === 0,
  );
}

/**
 * Images (issue 15): an image template's build time, and create → first command for a sandbox
 * of it on the local provider (overlay) and on the docker provider, beside the local provider's
 * host-system sandbox measured the same way in the same run.
 */
async function images(baseTemplate: string) {
  if (!dockerAnswers()) {
    row('9 images', 'skipped', '—', 'no Docker engine answers');
    return;
  }
  const image = localImage();
  if (!image) {
    row('9 images', 'skipped', '—', 'no local image: set ABX_BENCH_IMAGE (e.g. after docker pull)');
    return;
  }
  log(`images from ${image}`);
  const tpl = Template.fromImage(image).runCmd('echo built > /etc/abx-bench');
  const t0 = performance.now();
  await Templates.build(tpl, { name: 'bench-image' });
  const buildMs = performance.now() - t0;
  const firstCommand = async (template: string, home?: string) => {
    const samples: number[] = [];
    for (let i = 0; i < scale(15, 5); i++) {
      const t = performance.now();
      const box = await Sandbox.create({ template, ...(home ? { home } : {}) });
      await box.commands.run('true');
      samples.push(performance.now() - t);
      await box.kill();
    }
    return summarize(samples);
  };
  const host = await firstCommand(baseTemplate);
  const localImageRun = await firstCommand('bench-image');
  // The docker provider: a second installation whose daemon the SDK starts with ABX_PROVIDER.
  const dockerHome = mkdtempSync(join(tmpdir(), 'abx-bench-docker-'));
  let docker: Summary | undefined;
  let dockerBuildMs = Number.NaN;
  try {
    process.env.ABX_PROVIDER = 'docker';
    process.env.ABX_DOCKER_BASE_IMAGE = image;
    const t1 = performance.now();
    await Templates.build(tpl, { name: 'bench-image', home: dockerHome });
    dockerBuildMs = performance.now() - t1;
    docker = await firstCommand('bench-image', dockerHome);
    await Templates.remove('bench-image', { home: dockerHome });
  } finally {
    delete process.env.ABX_PROVIDER;
    delete process.env.ABX_DOCKER_BASE_IMAGE;
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), 'daemon', 'stop'], {
      env: { ...process.env, ABX_HOME: dockerHome },
    });
    rmSync(dockerHome, { recursive: true, force: true });
  }
  await Templates.remove('bench-image');
  results.images = {
    image,
    buildMs: { local: round(buildMs, 0), docker: round(dockerBuildMs, 0) },
    createToFirstCommand: { hostSystem: host, localImage: localImageRun, docker },
  };
  row(
    '9 images',
    `image template build (${image} + 1 step)`,
    `local ${round(buildMs, 0)} ms · docker ${round(dockerBuildMs, 0)} ms`,
    'a build: prepare the image (user added), one root step, commit',
  );
  const ratio = (s?: Summary) => (s ? `${round(s.p50 / host.p50, 2)}×` : '—');
  row('9 images', 'create → first command, host system (local)', ms(host), 'baseline');
  row(
    '9 images',
    'create → first command, image (local, overlay)',
    ms(localImageRun),
    `${ratio(localImageRun)} the baseline; the first sandbox of an image exports its file system (the p99)`,
  );
  if (docker)
    row(
      '9 images',
      'create → first command, image (docker)',
      ms(docker),
      `${ratio(docker)} the baseline`,
    );
}

/** Issue 16: a runCode round trip (`1+1` in a warm context) against a fresh interpreter per call. */
async function code(sandbox: Sandbox) {
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

/**
 * An SDK's floor: a trivial loopback server that answers each request (E2B's or the native SDK's)
 * with the bytes the gateway answered the first time it was asked (proxied to the gateway once,
 * then replayed from memory in one write, with a Content-Length). No server can answer faster, so
 * a call against it is what the SDK costs on its own (E2B's: its fetch stack, Connect framing,
 * form body).
 */
async function e2bFloorServer(gateway: Pool) {
  const recorded = new Map<
    string,
    { status: number; headers: Record<string, string>; body: Buffer }
  >();
  const server = createServer(async (req, res) => {
    const pieces: Buffer[] = [];
    for await (const piece of req) pieces.push(piece as Buffer);
    const key = `${req.method} ${(req.url ?? '').split('?')[0]}`;
    let answer = recorded.get(key);
    if (!answer) {
      const headers: Record<string, string> = {};
      for (const [name, value] of Object.entries(req.headers)) {
        if (!['host', 'connection', 'transfer-encoding', 'content-length'].includes(name)) {
          headers[name] = String(value);
        }
      }
      const upstream = await gateway.request({
        path: req.url ?? '/',
        method: req.method as 'POST',
        headers,
        body: Buffer.concat(pieces),
      });
      const body = Buffer.from(await upstream.body.arrayBuffer());
      const kept: Record<string, string> = {};
      for (const [name, value] of Object.entries(upstream.headers)) {
        if (
          !['transfer-encoding', 'connection', 'keep-alive', 'date', 'content-length'].includes(
            name,
          )
        ) {
          kept[name] = String(value);
        }
      }
      answer = { status: upstream.statusCode, headers: kept, body };
      recorded.set(key, answer);
    }
    res.writeHead(answer.status, { ...answer.headers, 'content-length': answer.body.length });
    res.end(answer.body);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    /** The answers recorded so far, as bench/reference/paced-replay.cjs reads them. */
    recorded: () =>
      Object.fromEntries(
        [...recorded].map(([key, { status, headers, body }]) => [
          key,
          { status, headers, body: body.toString('base64') },
        ]),
      ),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** Both SDKs against the paced replay server: answering at once, and working `delayMs` a call. */
type Paced = {
  delayMs: number;
  instant: { e2b: Summary; native: Summary };
  e2b: Summary;
  native: Summary;
};

/**
 * Each SDK's own share of its call's time at a given server speed: both SDKs against a replay
 * server in a process of its own (bench/reference/paced-replay.cjs) that answers with the bytes
 * abx answered, after spinning the CPU for `delayMs` (what abx's native path takes beyond the
 * native SDK's floor). The server works exactly alike for both, so what E2B's call takes over the
 * native one there is E2B's SDK's alone; against abx, the rest is abx's.
 */
async function pacedSdkShare(
  answers: Record<string, unknown>,
  delayMs: number,
  connect: (
    url: string,
  ) => Promise<{ e2b: () => Promise<unknown>; native: () => Promise<unknown> }>,
  rounds: number,
  per: number,
): Promise<{ e2b: Summary; native: Summary }> {
  const file = join(HOME, 'paced-answers.json');
  writeFileSync(file, JSON.stringify(answers));
  const { port, pid } = await startListening(process.execPath, [
    join(ROOT, 'bench', 'reference', 'paced-replay.cjs'),
    file,
    String(delayMs),
  ]);
  try {
    const calls = await connect(`http://127.0.0.1:${port}`);
    for (let i = 0; i < 200; i++) {
      await calls.e2b();
      await calls.native();
    }
    const samples = { e2b: [] as number[], native: [] as number[] };
    for (let pass = 0; pass < rounds; pass++) {
      samples.e2b.push(...(await timeEach(per, calls.e2b, 0)));
      samples.native.push(...(await timeEach(per, calls.native, 0)));
    }
    return { e2b: summarize(samples.e2b), native: summarize(samples.native) };
  } finally {
    process.kill(pid, 'SIGKILL');
  }
}

/**
 * E2B's SDK against abx (one URL: the gateway), beside the native SDK on the same sandbox, each
 * also against a trivial server that replays the answers at once ({@link e2bFloorServer}: the
 * SDK's own cost, its floor), sampled in interleaved rounds so that the machine's load touches all
 * alike. E2B's `commands.run(cmd)` starts `/bin/bash -l -c cmd`, a login shell, so the native
 * figure it is held against runs that same line. Each call is first made {@link E2B_WARM} times:
 * the daemon is a long-lived server, and a fresh one runs a path's JavaScript unoptimized, which
 * is not what a serving daemon's callers see. The face's paths take long to settle: a raw Connect
 * `List` had a p50 of 0.93 ms over its first 3000 calls and 0.51 ms over the next 10 000 (a raw
 * `GET /process`: 0.35 ms); so do E2B's SDK's own (its `files.write` was 0.6 ms slower at 150
 * calls than at 1000). The E2B figure
 * minus its floor is the server's part (gateway, face, envd), held against the native figure
 * minus its floor.
 */
async function e2b(sandbox: Sandbox) {
  log("E2B's SDK");
  const { Sandbox: E2bSandbox } = await import('e2b');
  const { gatewayUrl } = daemonInfo();
  const apiKey = readFileSync(join(HOME, 'api-key'), 'utf8').trim();
  const gateway = new Pool(gatewayUrl);
  const e2bHeaders = {
    'e2b-sandbox-id': sandbox.sandboxId,
    'e2b-sandbox-port': '49983',
    'x-access-token': sandbox.accessToken,
  };
  const nativeHeaders = {
    'x-sandbox-id': sandbox.sandboxId,
    'x-sandbox-port': '49983',
    'x-access-token': sandbox.accessToken,
  };
  const drainOk = async (answer: Promise<Dispatcher.ResponseData>) => {
    const res = await answer;
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`bench: ${res.statusCode} ${text}`);
  };
  const connect = (sandboxUrl: string) =>
    E2bSandbox.connect(sandbox.sandboxId, { apiKey, apiUrl: gatewayUrl, sandboxUrl });
  const theirs = await connect(gatewayUrl);
  const floorServer = await e2bFloorServer(gateway);
  const floor = await connect(floorServer.url);
  // The native SDK reaching the sandbox through the same replaying server: its own floor.
  const nativeFloor = await Sandbox.connect(sandbox.sandboxId, {
    apiUrl: gatewayUrl,
    apiKey,
    gatewayUrl: floorServer.url,
  });
  type Calls = {
    e2b: () => Promise<unknown>;
    native: () => Promise<unknown>;
    floor?: () => Promise<unknown>;
    nativeFloor?: () => Promise<unknown>;
  };
  const e2bCalls = (sdk: typeof theirs) => ({
    run: () => sdk.commands.run('true'),
    write: () => sdk.files.write('/home/user/e2b-bench.txt', 'hello'),
    list: () => sdk.commands.list(),
  });
  const nativeCalls = (sdk: Sandbox) => ({
    run: () => sdk.commands.run("/bin/bash -l -c 'true'"),
    write: () => sdk.files.write('/home/user/e2b-bench.txt', 'hello'),
    list: () => sdk.commands.list(),
  });
  const [ours, floors] = [e2bCalls(theirs), e2bCalls(floor)];
  const [native, nativeFloors] = [nativeCalls(sandbox), nativeCalls(nativeFloor)];
  const pairs: Record<string, Calls> = {};
  for (const name of ['run', 'write', 'list'] as const) {
    pairs[name] = {
      e2b: ours[name],
      floor: floors[name],
      native: native[name],
      nativeFloor: nativeFloors[name],
    };
  }
  // The face alone, without either SDK: a Connect List against envd's GET /process, both
  // through the gateway on a kept-alive connection.
  pairs.raw = {
    e2b: () =>
      drainOk(
        gateway.request({
          path: '/process.Process/List',
          method: 'POST',
          headers: {
            ...e2bHeaders,
            'content-type': 'application/json',
            'connect-protocol-version': '1',
          },
          body: '{}',
        }),
      ),
    native: () =>
      drainOk(gateway.request({ path: '/process', method: 'GET', headers: nativeHeaders })),
  };
  const rounds = scale(8, 3);
  const per = scale(25, 8);
  // This process's CPU time during the calls against the floors: what each SDK spends of its own
  // per call (the floor server's share is a trivial node:http answer). On a 2-core machine that
  // CPU (GC threads included) is taken from the daemon and envd while they answer a real call.
  type Kind = 'e2b' | 'native' | 'floor' | 'nativeFloor';
  type Samples = Record<Kind, number[]> & {
    floorCpuUs: number;
    nativeFloorCpuUs: number;
    /** The daemon's and envd's CPU (ms) during the E2B calls and during the native ones. */
    server: Record<'e2b' | 'native', { daemon: number; envd: number }>;
  };
  // The server's CPU during the calls against abx: the daemon's (gateway and E2B face) and the
  // sandbox's envd's, every thread of each: what abx itself spends on an E2B call beside a native
  // one, with neither SDK's CPU in it (a busy machine still inflates it a little: caches, wakeups).
  const daemonPid = daemonInfo().pid;
  const envdPid = envdPidOf(sandbox.sandboxId);
  const serverCpuMs = () => ({ daemon: threadsCpuMs(daemonPid), envd: threadsCpuMs(envdPid) });
  const cpuMicros = (used: NodeJS.CpuUsage) => used.user + used.system;
  const samples: Record<string, Samples> = {};
  for (const [name, calls] of Object.entries(pairs)) {
    samples[name] = {
      e2b: [],
      native: [],
      floor: [],
      nativeFloor: [],
      floorCpuUs: 0,
      nativeFloorCpuUs: 0,
      server: { e2b: { daemon: 0, envd: 0 }, native: { daemon: 0, envd: 0 } },
    };
    const warm = name === 'run' ? E2B_WARM.run : E2B_WARM.other;
    log(`E2B's SDK: warming ${name} (${warm} calls of each)`);
    for (let i = 0; i < warm; i++) {
      for (const call of Object.values(calls)) await call();
    }
  }
  for (let pass = 0; pass < rounds; pass++) {
    for (const [name, calls] of Object.entries(pairs)) {
      const into = samples[name] as Samples;
      for (const kind of ['e2b', 'native'] as const) {
        const before = serverCpuMs();
        into[kind].push(...(await timeEach(per, calls[kind], 0)));
        const after = serverCpuMs();
        into.server[kind].daemon += after.daemon - before.daemon;
        into.server[kind].envd += after.envd - before.envd;
      }
      if (calls.floor && calls.nativeFloor) {
        const floorCpu = process.cpuUsage();
        into.floor.push(...(await timeEach(per, calls.floor, 0)));
        into.floorCpuUs += cpuMicros(process.cpuUsage(floorCpu));
        const nativeFloorCpu = process.cpuUsage();
        into.nativeFloor.push(...(await timeEach(per, calls.nativeFloor, 0)));
        into.nativeFloorCpuUs += cpuMicros(process.cpuUsage(nativeFloorCpu));
      }
    }
  }
  // Each SDK's own share at abx's speed (see pacedSdkShare), for the calls whose server part is
  // the server's work (not a command's run time). First against the replay server answering at
  // once (each SDK's floor out of process), then against it working as long as abx's native path
  // takes over that floor.
  const paced: Record<string, Paced> = {};
  for (const name of ['write', 'list'] as const) {
    const against = (delayMs: number) =>
      pacedSdkShare(
        floorServer.recorded(),
        delayMs,
        async (url) => {
          const [e2bSdk, nativeSdk] = [
            await connect(url),
            await Sandbox.connect(sandbox.sandboxId, {
              apiUrl: gatewayUrl,
              apiKey,
              gatewayUrl: url,
            }),
          ];
          return { e2b: e2bCalls(e2bSdk)[name], native: nativeCalls(nativeSdk)[name] };
        },
        rounds,
        per,
      );
    const instant = await against(0);
    const delayMs = Math.max(0, median((samples[name] as Samples).native) - instant.native.p50);
    log(`E2B's SDK: ${name} against a replay server as slow as abx (${round(delayMs, 2)} ms)`);
    paced[name] = { delayMs: round(delayMs, 3), instant, ...(await against(delayMs)) };
  }
  await floorServer.close();
  type Figures = {
    e2b: Summary;
    native: Summary;
    floor?: Summary;
    nativeFloor?: Summary;
    /** Each SDK's own CPU per call (ms), measured against the floor server. */
    floorCpuMs?: number;
    nativeFloorCpuMs?: number;
    /** The daemon's and envd's CPU per call (ms), E2B's and native's. */
    serverCpuMs: Record<'e2b' | 'native', { daemon: number; envd: number }>;
    /**
     * Both SDKs against a replay server of their own process (pacedSdkShare): answering at once,
     * and working `delayMs` a call, as long as abx's native path.
     */
    paced?: Paced;
  };
  const figures: Record<string, Figures> = {};
  const calls = rounds * per;
  const perCall = (cpu: { daemon: number; envd: number }) => ({
    daemon: round(cpu.daemon / calls, 3),
    envd: round(cpu.envd / calls, 3),
  });
  const serverCpu = (cpu: { daemon: number; envd: number }) => cpu.daemon + cpu.envd;
  for (const [name, into] of Object.entries(samples)) {
    figures[name] = {
      e2b: summarize(into.e2b),
      native: summarize(into.native),
      serverCpuMs: { e2b: perCall(into.server.e2b), native: perCall(into.server.native) },
      ...(paced[name] ? { paced: paced[name] } : {}),
      ...(into.floor.length > 0
        ? {
            floor: summarize(into.floor),
            nativeFloor: summarize(into.nativeFloor),
            floorCpuMs: round(into.floorCpuUs / calls / 1000, 2),
            nativeFloorCpuMs: round(into.nativeFloorCpuUs / calls / 1000, 2),
          }
        : {}),
    };
  }
  results.e2b = figures;
  const what: Record<string, [string, string]> = {
    run: [
      "E2B commands.run('true') (bash -l -c true)",
      'native commands.run("/bin/bash -l -c \'true\'")',
    ],
    write: ['E2B files.write, 5 bytes', 'native files.write, 5 bytes'],
    list: ['E2B commands.list() (Connect List)', 'native commands.list()'],
    raw: ['raw Connect List through the gateway (no SDK)', 'raw GET /process through the gateway'],
  };
  for (const [name, f] of Object.entries(figures)) {
    const [theirsText, oursText] = what[name] as [string, string];
    const over = f.e2b.p50 - f.native.p50;
    const server =
      f.floor && f.nativeFloor
        ? `; server's part ${round(f.e2b.p50 - f.floor.p50, 2)} ms vs native's ${round(f.native.p50 - f.nativeFloor.p50, 2)} ms`
        : '';
    row('12 E2B SDK', theirsText, ms(f.e2b), `${round(over, 2)} ms over native${server}`);
    if (f.floor && f.nativeFloor) {
      row(
        '12 E2B SDK',
        "  the same E2B call against a trivial server (E2B's SDK alone)",
        ms(f.floor),
        `client CPU per call ${f.floorCpuMs} ms`,
      );
      row(
        '12 E2B SDK',
        '  the same native call against that server (the native SDK alone)',
        ms(f.nativeFloor),
        `client CPU per call ${f.nativeFloorCpuMs} ms; the SDKs differ by ${round(f.floor.p50 - f.nativeFloor.p50, 2)} ms before any server`,
      );
    }
    const { e2b: theirCpu, native: ourCpu } = f.serverCpuMs;
    row(
      '12 E2B SDK',
      `  server CPU per call (daemon + envd), E2B's / native's`,
      `${round(serverCpu(theirCpu), 2)} / ${round(serverCpu(ourCpu), 2)} ms`,
      `${round(serverCpu(theirCpu) - serverCpu(ourCpu), 2)} ms over native; daemon ${theirCpu.daemon} / ${ourCpu.daemon} ms, envd ${theirCpu.envd} / ${ourCpu.envd} ms`,
    );
    if (f.paced) {
      const { instant } = f.paced;
      const sdkShare = f.paced.e2b.p50 - f.paced.native.p50;
      row(
        '12 E2B SDK',
        '  both SDKs against a replay server in its own process answering at once, E2B / native',
        `${round(instant.e2b.p50, 2)} / ${round(instant.native.p50, 2)} ms`,
        `E2B's SDK's own share ${round(instant.e2b.p50 - instant.native.p50, 2)} ms over native`,
      );
      row(
        '12 E2B SDK',
        `  the same, the server working ${round(f.paced.delayMs, 2)} ms a call (native's p50 as against abx), E2B / native`,
        `${round(f.paced.e2b.p50, 2)} / ${round(f.paced.native.p50, 2)} ms`,
        `E2B's SDK's own share ${round(sdkShare, 2)} ms over native; abx's share of the ${round(over, 2)} ms: ${round(over - sdkShare, 2)} ms`,
      );
    }
    row('12 E2B SDK', oursText, ms(f.native));
  }
  const fig = (name: string) => figures[name] as Required<Figures>;
  const [run, write, list] = [fig('run'), fig('write'), fig('list')];
  const ends: [string, string, Required<Figures>][] = [
    ['e2bRunOverNativeMs', 'E2B commands.run over native (same command)', run],
    ['e2bWriteOverNativeMs', 'E2B files.write over native', write],
    ['e2bListOverNativeMs', 'E2B commands.list over native', list],
  ];
  for (const [key, figure, f] of ends) goal(key, figure, f.e2b.p50 - f.native.p50, 'ms', 1, false);
  const overRaw = figures.raw as Figures;
  goal(
    'e2bFaceOverNativeMs',
    'the E2B face alone: Connect List over GET /process',
    overRaw.e2b.p50 - overRaw.native.p50,
    'ms',
    1,
    false,
  );
  // The server's part of each call (the call minus its SDK's floor), E2B's over native's: what
  // the gateway, the face and envd add to an E2B call, with neither SDK's own cost in it.
  const servers: [string, string, Required<Figures>][] = [
    ['e2bRunServerOverNativeMs', 'commands.run', run],
    ['e2bWriteServerOverNativeMs', 'files.write', write],
    ['e2bListServerOverNativeMs', 'commands.list', list],
  ];
  for (const [key, call, f] of servers) {
    goal(
      key,
      `E2B ${call}'s server part over native's (each minus its SDK's floor)`,
      f.e2b.p50 - f.floor.p50 - (f.native.p50 - f.nativeFloor.p50),
      'ms',
      1,
      false,
    );
  }
  await gateway.close();
}

/**
 * How long `abx` takes to start, as a person at a terminal feels it: `abx --version` and
 * `abx list` (the daemon running, a sandbox listed) against `node -e 0`, the floor of any Node
 * program, each run the same number of times, interleaved so that a change in the machine's load
 * touches all three alike.
 */
async function cliStart() {
  log('abx start time');
  const cli = join(ROOT, 'dist', 'cli.js');
  const programs: Record<string, string[]> = {
    node: ['-e', '0'],
    version: [cli, '--version'],
    list: [cli, 'list'],
  };
  const samples: Record<string, number[]> = { node: [], version: [], list: [] };
  const rounds = scale(15, 5);
  for (let i = 0; i < rounds + 2; i++) {
    for (const [name, args] of Object.entries(programs)) {
      const started = performance.now();
      const run = spawnSync(process.execPath, args, { env: process.env, encoding: 'utf8' });
      const elapsed = performance.now() - started;
      if (run.status !== 0) throw new Error(`${name} exited ${run.status}: ${run.stderr}`);
      // The first two rounds warm the file cache (and Node's compile cache, where it has one).
      if (i >= 2) samples[name]?.push(elapsed);
    }
  }
  const [node, version, list] = [samples.node, samples.version, samples.list].map((s) =>
    summarize(s ?? []),
  ) as [Summary, Summary, Summary];
  results.cliStart = { node, version, list };
  goal(
    'cliVersionVsNodeRatio',
    'abx --version vs node -e 0',
    version.p50 / node.p50,
    '×',
    2,
    false,
  );
  goal('cliListVsNodeRatio', 'abx list vs node -e 0', list.p50 / node.p50, '×', 2, false);
  row('11 abx start', 'node -e 0 (the floor)', ms(node));
  row(
    '11 abx start',
    'abx --version',
    ms(version),
    `${round(version.p50 / node.p50, 2)}× node; goal ≤ 2×`,
  );
  row(
    '11 abx start',
    'abx list (daemon running)',
    ms(list),
    `${round(list.p50 / node.p50, 2)}× node; goal ≤ 2×`,
  );
}

/** Pids of the processes whose environment holds `ABX_SANDBOX_NET=<id>` (a sandbox's holder and slirp4netns). */
function sandboxNetProcesses(id: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (
        readFileSync(`/proc/${entry}/environ`, 'utf8').split('\0').includes(`ABX_SANDBOX_NET=${id}`)
      )
        found.push(Number(entry));
    } catch {
      // ended meanwhile, or not ours to read
    }
  }
  return found;
}

/**
 * A process's CPU time so far, in ms, summed over its threads (V8's GC helpers and libuv's pool
 * included) from the scheduler's nanosecond counters: fine enough for a fraction of a ms per call,
 * where /proc/PID/stat counts 10 ms ticks. A thread that ended meanwhile is not counted.
 */
function threadsCpuMs(pid: number): number {
  let ns = 0;
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // ended meanwhile
    }
  }
  return ns / 1e6;
}

/**
 * A process's CPU time so far (user + system), in ms; 0 when it is gone. In 10 ms ticks, but
 * counting threads that ended too: for seconds of work (a download, an idle sandbox), where
 * {@link threadsCpuMs} is for fractions of a ms per call.
 */
function cpuMs(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) * (1000 / 100);
  } catch {
    return 0;
  }
}

/** The first process whose parent is `parent` and whose command line contains `text`. */
function childMentioning(parent: number, text: string): number | undefined {
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === parent && readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(text))
        return Number(entry);
    } catch {
      // ended meanwhile
    }
  }
  return undefined;
}

/**
 * Egress (issue 28): a 100 MiB download from inside an `internet` sandbox, through egress, as a
 * share of the same download made straight from the egress namespace (`ip netns exec`), to the
 * same server of the tests' stand-in internet (test/helpers/internet.ts: a network namespace
 * with TEST-NET servers and no route out). Three ways: HTTP on port 80 (egress's HTTP proxy, by
 * the Host header), HTTPS on 443 (its TLS passthrough, by the SNI) and plain TCP to port 8080
 * (no proxy: slirp4netns alone, the address opened by egress's DNS), each timed by curl's
 * `time_total`, interleaved, the median of several. The CPU time of the egress service and of
 * the sandbox's slirp4netns over the timed downloads says where the time goes. Its own daemon
 * (`ABX_EGRESS_NETNS` the stand-in internet) and `$ABX_HOME`; needs root.
 */
async function egress() {
  const unavailable = internetUnavailable();
  if (unavailable) {
    row('13 egress', 'skipped', '—', `needs root and a test internet: ${unavailable}`);
    results.egress = { skipped: unavailable };
    return;
  }
  log('egress: a stand-in internet, a daemon on it, an internet sandbox');
  const home = mkdtempSync(join(tmpdir(), 'abx-bench-egress-'));
  let internet: TestInternet | undefined;
  const ids: string[] = [];
  const cli = (...args: string[]) =>
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), ...args], {
      encoding: 'utf8',
      env: {
        ...process.env,
        ABX_HOME: home,
        // One sandbox: no pooled ones holding namespaces beside it.
        ABX_WARM_POOL: '0',
        ...(internet
          ? {
              ABX_EGRESS_NETNS: internet.path,
              ABX_EGRESS_HOSTS: internet.hostsFile,
              // Egress verifies the origins it opens TLS to itself (a host with header rules).
              NODE_EXTRA_CA_CERTS: internet.caCert,
            }
          : {}),
      },
    });
  // Also on Ctrl-C or a kill: sandboxes, their network processes, the daemon, the namespace.
  const cleanUp = () => {
    for (const id of ids) cli('kill', id);
    cli('daemon', 'stop');
    for (const pid of ids.flatMap(sandboxNetProcesses)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    internet?.remove();
    rmSync(home, { recursive: true, force: true });
  };
  const onSignal = (signal: NodeJS.Signals) => {
    cleanUp();
    process.kill(process.pid, signal);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    internet = await makeInternet();
    const started = cli('daemon', 'start');
    if (started.status !== 0) {
      throw new Error(
        `abx daemon start (egress bench) exited ${started.status}: ${started.stderr}`,
      );
    }
    await Templates.build(
      Template.fromBase().setNetwork('internet', {
        allowOut: ['allowed.test'],
        denyOut: ['0.0.0.0/0'],
      }),
      { name: 'egress', home },
    );
    const box = await Sandbox.create({ template: 'egress', home });
    ids.push(box.sandboxId);
    await box.files.write('/tmp/ca.pem', readFileSync(internet.caCert, 'utf8'));
    // www.allowed.test (the same server) has a header rule with a secret: egress terminates its
    // TLS and opens its own; allowed.test stays passthrough by SNI.
    await Secret.create('bench-token', 'bench-secret-value', { home });
    await box.setNetwork({
      allowOut: ['allowed.test', 'www.allowed.test'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'www.allowed.test': [
          // biome-ignore lint/suspicious/noTemplateCurlyInString: abx's placeholder, sent as text
          { transform: { headers: { Authorization: 'Bearer ${secrets.bench-token}' } } },
        ],
      },
    });
    const daemonPid = (
      JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as { pid: number }
    ).pid;
    const egressPid = childMentioning(daemonPid, 'egress.js');
    const slirpPid = sandboxNetProcesses(box.sandboxId).find((pid) =>
      readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('slirp4netns'),
    );
    const size = 100 * 1024 * 1024;
    const rounds = scale(5, 3);
    const format = '%{http_code} %{size_download} %{time_total}';
    const seconds = (how: string, out: string) => {
      const [code, bytes, total] = out.trim().split(' ');
      if (code !== '200' || Number(bytes) !== size) {
        throw new Error(`egress bench: ${how} got HTTP ${code} and ${bytes} of ${size} bytes`);
      }
      return Number(total);
    };
    const { ns, caCert, addresses } = internet;
    const ways = {
      http: { port: 80, url: `http://allowed.test/bytes/${size}`, tls: false },
      https: { port: 443, url: `https://allowed.test/bytes/${size}`, tls: true },
      httpsRule: { port: 443, url: `https://www.allowed.test/bytes/${size}`, tls: true },
      tcp: { port: 8080, url: `http://allowed.test:8080/bytes/${size}`, tls: false },
    };
    type Way = keyof typeof ways;
    const straight = (way: Way) => {
      const { port, url, tls } = ways[way];
      const run = spawnSync(
        'ip',
        [
          ...['netns', 'exec', ns, 'curl', '-sS', '--max-time', '120', '-o', '/dev/null'],
          ...['-w', format, '--resolve', `${new URL(url).hostname}:${port}:${addresses.allowed}`],
          ...(tls ? ['--cacert', caCert] : []),
          url,
        ],
        { encoding: 'utf8' },
      );
      if (run.status !== 0) throw new Error(`egress bench: straight ${way}: ${run.stderr}`);
      return seconds(`straight ${way}`, run.stdout);
    };
    const through = async (way: Way) => {
      const { url, tls } = ways[way];
      // A host with rules is shown egress's certificate (the sandbox's bundle trusts its CA).
      const ca = way === 'httpsRule' ? '' : tls ? '--cacert /tmp/ca.pem ' : '';
      const { stdout } = await box.commands.run(
        `curl -sS --max-time 120 -o /dev/null -w '${format}' ${ca}${url}`,
        { timeoutMs: 180_000 },
      );
      return seconds(`${way} through egress`, stdout);
    };
    const samples = Object.fromEntries(
      Object.keys(ways).map((way) => [way, { straight: [] as number[], through: [] as number[] }]),
    ) as Record<Way, { straight: number[]; through: number[] }>;
    const cpu = Object.fromEntries(
      Object.keys(ways).map((way) => [way, { egress: 0, slirp: 0 }]),
    ) as Record<Way, { egress: number; slirp: number }>;
    // A first round untimed (the egress service's JIT, the page cache), then interleaved rounds.
    for (let pass = 0; pass <= rounds; pass++) {
      for (const way of Object.keys(ways) as Way[]) {
        const straightSeconds = straight(way);
        const before = [cpuMs(egressPid), cpuMs(slirpPid)];
        const throughSeconds = await through(way);
        if (pass === 0) continue;
        cpu[way].egress += cpuMs(egressPid) - (before[0] as number);
        cpu[way].slirp += cpuMs(slirpPid) - (before[1] as number);
        samples[way].straight.push(straightSeconds);
        samples[way].through.push(throughSeconds);
      }
    }
    const mib = size / 1024 / 1024;
    const figures: Record<string, unknown> = { mib, rounds };
    const labels: Record<Way, string> = {
      http: 'HTTP (port 80: egress HTTP proxy)',
      https: 'HTTPS (443: egress TLS passthrough by SNI)',
      httpsRule: 'HTTPS to a host with a header rule (443: TLS terminated, a secret set)',
      tcp: 'TCP to port 8080 (no proxy: slirp4netns alone)',
    };
    for (const way of Object.keys(ways) as Way[]) {
      const straightMiBps = round(mib / median(samples[way].straight), 1);
      const throughMiBps = round(mib / median(samples[way].through), 1);
      const sharePct = round((100 * throughMiBps) / straightMiBps, 1);
      const perRun = (ms: number) => round(ms / rounds, 0);
      figures[way] = {
        straightSeconds: samples[way].straight,
        throughSeconds: samples[way].through,
        straightMiBps,
        throughMiBps,
        sharePct,
        egressCpuMsPerDownload: perRun(cpu[way].egress),
        slirpCpuMsPerDownload: perRun(cpu[way].slirp),
      };
      row(
        '13 egress',
        `${mib} MiB ${labels[way]}: straight / through egress`,
        `${straightMiBps} / ${throughMiBps} MiB/s`,
        `${sharePct}% of straight (median of ${rounds}); CPU per download: egress service ${perRun(cpu[way].egress)} ms, slirp4netns ${perRun(cpu[way].slirp)} ms`,
      );
    }
    figures.requests = await ruleRequests(box, rounds);
    results.egress = figures;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    cleanUp();
  }
}

/**
 * Small HTTPS requests from inside the sandbox, each on a new connection (a handshake each), to a
 * host with a header rule (egress terminates TLS, resolves the secret, opens its own TLS) and to
 * one passed through by SNI, interleaved: the medians and their ratio.
 */
async function ruleRequests(box: Sandbox, rounds: number) {
  const count = scale(40, 15);
  const script = `
const https = require('node:https'), fs = require('node:fs');
const ca = [fs.readFileSync('/tmp/ca.pem'), fs.readFileSync('/run/abx/egress-ca.pem')];
const get = (host) => new Promise((ok, fail) => {
  const t = process.hrtime.bigint();
  https.get({ host, path: '/headers', agent: false, ca }, (r) => {
    let body = ''; r.on('data', (c) => (body += c));
    r.on('end', () => ok([Number(process.hrtime.bigint() - t) / 1e6, JSON.parse(body).authorization]));
  }).on('error', fail);
});
(async () => {
  const out = { rule: [], passthrough: [], header: undefined };
  for (let i = 0; i < ${count}; i++) {
    const [a, header] = await get('www.allowed.test'); out.rule.push(a); out.header = header;
    out.passthrough.push((await get('allowed.test'))[0]);
  }
  console.log(JSON.stringify(out));
})();`;
  const medians = { rule: [] as number[], passthrough: [] as number[] };
  for (let pass = 0; pass <= rounds; pass++) {
    await box.files.write('/tmp/rule-requests.cjs', script);
    const { stdout } = await box.commands.run('node /tmp/rule-requests.cjs', {
      timeoutMs: 120_000,
    });
    const out = JSON.parse(stdout) as { rule: number[]; passthrough: number[]; header?: string };
    if (out.header !== 'Bearer bench-secret-value') {
      throw new Error(`egress bench: the rule's header did not arrive (${out.header})`);
    }
    if (pass === 0) continue;
    medians.rule.push(median(out.rule));
    medians.passthrough.push(median(out.passthrough));
  }
  const ruleMs = round(median(medians.rule), 2);
  const passthroughMs = round(median(medians.passthrough), 2);
  const ratio = round(ruleMs / passthroughMs, 2);
  row(
    '13 egress',
    'HTTPS request on a new connection: header rule (TLS terminated) / passthrough',
    `${ruleMs} / ${passthroughMs} ms`,
    `${ratio}× (median of ${rounds} runs of ${count} interleaved requests each)`,
  );
  return { count, ruleMs, passthroughMs, ratio };
}

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
    if (runs('deepagents')) await deepagentsSearch({ quick: QUICK, log, row, goal, results });
    if (runs('workspace'))
      await workspaceMount({ quick: QUICK, log, row, goal, results }, template);
    if (runs('webhooks')) await webhookCost({ quick: QUICK, log, row, goal, results });
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
    '| goal (results.json key) | figure | value | goal | met |',
    '| --- | --- | --- | --- | --- |',
    ...goals.map(
      (g) =>
        `| \`${g.key}\` | ${g.figure} | ${g.value} ${g.unit} | ${g.atLeast ? '≥' : '≤'} ${g.target} ${g.unit} | ${met(g) ? 'met' : 'not met'} |`,
    ),
  ];
  console.log(lines.join('\n'));
}

await main();
