import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { CLI, runProgram } from './abx.js';

// A daemon keeps its loopback ports across restarts (src/installation/daemon-ports.ts), so the lines
// `abx e2b env` printed stay valid. The test harness gives every other daemon random ports
// (ABX_API_PORT=0, test/global-setup.ts); these daemons run without those variables.

/** The test's environment without the harness's random-port variables. */
function environment(home: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (value !== undefined && name !== 'ABX_API_PORT' && name !== 'ABX_GATEWAY_PORT') {
      env[name] = value;
    }
  }
  return { ...env, ABX_HOME: home, HOME: home, NO_COLOR: '1', ABX_WARM_POOL: '0' };
}

/** Listens on 127.0.0.1:port (0: a free one), as "another process" holding a port. */
function hold(port = 0): Promise<Server> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server));
  });
}
const portOf = (server: Server) => (server.address() as { port: number }).port;
const release = (server: Server) => new Promise((resolve) => server.close(resolve));

describe('the daemon keeps its ports', () => {
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let run: (args: string[], extra?: Record<string, string>) => ReturnType<typeof runProgram>;
  const held: Server[] = [];

  beforeAll(async () => {
    abx = await createAbxHome();
    run = (args, extra = {}) =>
      runProgram(process.execPath, [CLI, ...args], {
        inheritEnv: false,
        env: { ...environment(abx.home), ...extra },
      });
  });

  afterAll(async () => {
    for (const server of held) await release(server);
    await abx?.close();
  }, 120_000);

  const urls = (stdout: string) => {
    const match = /listening: API (http:\S+), gateway (http:\S+)$/m.exec(stdout);
    expect(match, stdout).not.toBeNull();
    return { api: match?.[1] as string, gateway: match?.[2] as string };
  };

  test("abx e2b env's lines, printed before a restart, still work with E2B's SDK after it", async () => {
    const started = await run(['daemon', 'start']);
    expect(started.stderr).toBe('');
    expect(started.code).toBe(0);
    const first = urls(started.stdout);
    const file = join(abx.home, 'ports.json');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual({
      api: Number(new URL(first.api).port),
      gateway: Number(new URL(first.gateway).port),
    });
    // A new port is chosen below the kernel's ephemeral range (outgoing connections' ports).
    const ephemeral = Number(
      readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').split(/\s+/)[0],
    );
    expect(Number(new URL(first.api).port)).toBeLessThan(ephemeral);

    const printed = await run(['e2b', 'env']);
    expect(printed.code, printed.stderr).toBe(0);
    expect(printed.stdout).toMatch(
      new RegExp(`^export E2B_SANDBOX_URL='?${first.gateway}'?$`, 'm'),
    );

    expect((await run(['daemon', 'stop'])).stdout).toBe('daemon stopped\n');
    const again = await run(['daemon', 'start']);
    expect(again.code, again.stderr).toBe(0);
    expect(urls(again.stdout)).toEqual(first);

    // A program configured by the lines printed before the restart, nothing else.
    const script = join(abx.home, 'after-restart.mjs');
    writeFileSync(
      script,
      `import { Sandbox } from ${JSON.stringify(join(ROOT, 'node_modules', 'e2b', 'dist', 'index.mjs'))};
const sandbox = await Sandbox.create({ requestTimeoutMs: 60_000 });
const ran = await sandbox.commands.run('echo after the restart from $(hostname)');
await sandbox.kill();
console.log(JSON.stringify({ id: sandbox.sandboxId, out: ran.stdout }));
`,
    );
    const client = await runProgram(
      '/bin/sh',
      ['-c', `${printed.stdout}\nexec "$0" "$1"`, process.execPath, script],
      { inheritEnv: false, env: { HOME: abx.home } },
    );
    expect(client.stderr).toBe('');
    expect(client.code).toBe(0);
    const out = JSON.parse(client.stdout);
    expect(out.out).toBe(`after the restart from ${out.id}\n`);
  }, 180_000);

  test('a kept port another process holds: one clear line, no daemon, nothing moved; --api-port 0 is a random one', async () => {
    const file = join(abx.home, 'ports.json');
    const kept = JSON.parse(readFileSync(file, 'utf8')) as { api: number; gateway: number };
    expect((await run(['daemon', 'stop'])).stdout).toBe('daemon stopped\n');
    const blocker = await hold(kept.api);
    held.push(blocker);

    const refused = await run(['daemon', 'start']);
    expect(refused.code).toBe(1);
    expect(refused.stdout).toBe('');
    const line = refused.stderr.split('\n')[0] as string;
    expect(line).toMatch(
      new RegExp(
        `^abx: DaemonUnavailableError: the abx daemon did not start: the API port ${kept.api} on 127\\.0\\.0\\.1 is in use by another process \\(\`ss -ltnp 'sport = :${kept.api}'\` shows which process\\); .*--api-port N \\(ABX_API_PORT=N\\).*--api-port 0 for a random one$`,
      ),
    );
    expect((await run(['daemon', 'status'])).code).toBe(1);
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual(kept);

    // Asked for: a random API port this start; the gateway keeps its own; the file is unchanged.
    const random = await run(['daemon', 'start', '--api-port', '0']);
    expect(random.code, random.stderr).toBe(0);
    const moved = urls(random.stdout);
    expect(Number(new URL(moved.api).port)).not.toBe(kept.api);
    expect(moved.gateway).toBe(`http://127.0.0.1:${kept.gateway}`);
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual(kept);
    // A daemon on other ports runs: asking for a given one says so rather than doing nothing.
    const busy = await run(['daemon', 'start', '--api-port', String(kept.api)]);
    expect(busy.code).toBe(2);
    expect(busy.stderr).toContain(
      `a daemon runs already (pid ${/daemon (\d+)/.exec(random.stdout)?.[1]}) with its API on ${moved.api}; stop it first (abx daemon stop) to start one with --api-port ${kept.api}`,
    );
    expect((await run(['daemon', 'stop'])).code).toBe(0);

    await release(held.pop() as Server);
    const back = await run(['daemon', 'start']);
    expect(back.code, back.stderr).toBe(0);
    expect(urls(back.stdout)).toEqual({
      api: `http://127.0.0.1:${kept.api}`,
      gateway: `http://127.0.0.1:${kept.gateway}`,
    });
  }, 120_000);

  test('--api-port N --gateway-port M are kept from then on; a held gateway port names its flag', async () => {
    expect((await run(['daemon', 'stop'])).code).toBe(0);
    const free = await Promise.all([hold(), hold()]);
    const [api, gateway] = free.map(portOf) as [number, number];
    for (const server of free) await release(server);
    const given = await run([
      'daemon',
      'start',
      '--api-port',
      String(api),
      '--gateway-port',
      String(gateway),
    ]);
    expect(given.code, given.stderr).toBe(0);
    expect(urls(given.stdout)).toEqual({
      api: `http://127.0.0.1:${api}`,
      gateway: `http://127.0.0.1:${gateway}`,
    });
    expect(JSON.parse(readFileSync(join(abx.home, 'ports.json'), 'utf8'))).toEqual({
      api,
      gateway,
    });
    expect((await run(['daemon', 'stop'])).code).toBe(0);
    const plain = await run(['daemon', 'start']);
    expect(urls(plain.stdout)).toEqual(urls(given.stdout));
    expect((await run(['daemon', 'stop'])).code).toBe(0);

    const blocker = await hold(gateway);
    held.push(blocker);
    const refused = await run(['daemon', 'start']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      new RegExp(
        `the gateway port ${gateway} on 127\\.0\\.0\\.1 is in use by another process .*--gateway-port N \\(ABX_GATEWAY_PORT=N\\)`,
      ),
    );
    // The API's listener it had opened is closed again: the port is free.
    const api2 = await hold(api);
    await release(api2);
    await release(held.pop() as Server);
  }, 120_000);

  test('bad ports are usage errors (exit 2), from the flag or the variable', async () => {
    for (const [args, env, message] of [
      [
        ['--api-port', '70000'],
        {},
        "--api-port must be a TCP port, 1 to 65535 (0: a random free port each start, not kept), not '70000'",
      ],
      [
        ['--gateway-port', 'http'],
        {},
        "--gateway-port must be a TCP port, 1 to 65535 (0: a random free port each start, not kept), not 'http'",
      ],
      [[], { ABX_API_PORT: '-1' }, '--api-port must be a TCP port'],
    ] as const) {
      const result = await run(['daemon', 'start', ...args], env);
      expect(result.code).toBe(2);
      expect(result.stderr).toContain(message);
    }
    // The daemon process itself (as a service manager runs it) refuses the same way.
    const direct = await runProgram(process.execPath, [join(ROOT, 'dist', 'daemon.js')], {
      inheritEnv: false,
      env: { ...environment(abx.home), ABX_GATEWAY_PORT: '8o80' },
    });
    expect(direct.code).toBe(1);
    expect(direct.stderr).toBe(
      "abx daemon: ABX_GATEWAY_PORT (--gateway-port) must be a TCP port, 1 to 65535 (0: a random free port each start, not kept), not '8o80'\n",
    );
  }, 60_000);
});
