// `--only e2b` (bench/README.md).
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { Sandbox } from 'abx-sandbox';
import { type Dispatcher, Pool } from 'undici';
import { daemonInfo, envdPidOf, startListening, threadsCpuMs } from '../measure.js';
import { E2B_WARM, goal, HOME, log, ms, ROOT, results, row, scale } from '../runner.js';
import { median, round, type Summary, summarize, timeEach } from '../stats.js';

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
export async function e2b(sandbox: Sandbox) {
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
