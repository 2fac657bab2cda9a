import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { SandboxStartError } from '../../src/errors.js';
import type { SandboxHandle, SandboxProvider, SandboxSpec } from '../../src/providers/provider.js';
import { connectSandboxSocket, sandboxPortTarget } from '../../src/providers/sandbox-socket.js';

/** What every provider's constructor must accept, so the suite can make `create` time out. */
export interface ContractProviderOptions {
  /** How long a new sandbox's envd has to answer before `create` gives up. */
  startTimeoutMs?: number;
}

/** What the suite needs to know about the provider under test beyond its interface. */
export interface ProviderContractOptions {
  /** The isolation mode the provider must report on this host. */
  mode: 'root' | 'rootless';
  /**
   * What sandbox `id` (folder `dir`) still holds on the host, one line per thing: processes,
   * cgroups, uids, mounts, containers, volumes... The suite expects lines while the sandbox runs
   * (so a blind probe fails) and none after `kill`, after a failed `create`, after `sweepOrphans`.
   * May be async (an engine's API).
   */
  leftovers(id: string, dir: string, handle?: SandboxHandle): string[] | Promise<string[]>;
  /** Removes whatever `leftovers` still reports once the suite is done (a test failed). */
  removeLeftovers?(id: string, dir: string): Promise<void>;
  /**
   * The sandbox is a pod reached over the network, not processes of this host (kubernetes,
   * against an API double whose "kubelet" runs pods as host processes). What a node enforces
   * (rlimits, disk quota, `network: none`, seccomp, the OOM killer) is the kubelet's and the
   * container runtime's work, not the provider's, and the double does none of it: those checks
   * are left out. `crash` ends a sandbox from outside (a node killing its container), since
   * `kill -9 -1` inside cannot end a pod's pid 1.
   */
  pod?: {
    crash(handle: SandboxHandle): void | Promise<void>;
    /**
     * The hostname a sandbox has when it is not its id: a pod pre-started by a warm pool (claims)
     * has its pool Sandbox's name, given before the sandbox existed.
     */
    hostname?(handle: SandboxHandle): string;
  };
}

interface ShellResult {
  stdout: string;
  stderr: string;
  exit_code: number;
  error?: string;
}

const MiB = 1024 * 1024;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `value` until `done` holds or `ms` pass; returns the last value (for the assertion). */
async function settle<T>(
  value: () => T | Promise<T>,
  done: (v: T) => boolean,
  ms = 5000,
): Promise<T> {
  const deadline = Date.now() + ms;
  let last = await value();
  while (!done(last) && Date.now() < deadline) {
    await sleep(20);
    last = await value();
  }
  return last;
}

/** `POST /process/exec` on the sandbox's envd: runs `cmd` with `/bin/sh -c` to completion. */
async function sh(handle: SandboxHandle, token: string, cmd: string): Promise<ShellResult> {
  const { status, body } = await envdRequest<ShellResult>(
    handle.envdSocket,
    token,
    'POST',
    '/process/exec',
    { cmd, timeout: 20 },
    25_000,
  );
  expect(status, body.error ?? body.stderr).toBe(200);
  return body;
}

/** One GET over a sandbox's Unix socket (a forwarded port), connected the daemon's safe way. */
function httpGet(socketPath: string, path: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        socketPath,
        createConnection: () => connectSandboxSocket(socketPath),
        path,
        timeout: 2000,
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          body += chunk;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`GET ${path} timed out`)));
    req.on('error', reject);
    req.end();
  });
}

/** Forks until the sandbox refuses, kills the children, prints how many it got. */
const FORK_UNTIL_REFUSED = `/usr/bin/python3 -c '
import os, signal
pids = []
try:
    for _ in range(500):
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        pids.append(pid)
except OSError:
    pass
for pid in pids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(len(pids))
'`;

/**
 * The contract every `SandboxProvider` must pass (see docs/providers.md), run against a real
 * provider without a daemon. The sandbox image must have `/bin/sh`, coreutils, `unshare` and
 * `/usr/bin/python3`. `makeProvider` is called for the provider under test and again wherever
 * the suite plays a restarted daemon (a new instance given stored handles).
 */
export function providerContract(
  name: string,
  makeProvider: (options: ContractProviderOptions) => SandboxProvider,
  options: ProviderContractOptions,
): void {
  describe(`SandboxProvider contract: ${name}`, () => {
    let folder: string;
    let provider: SandboxProvider;
    const providers: SandboxProvider[] = [];
    const specs: SandboxSpec[] = [];
    /** Sandboxes a test started; killed after it, whatever happened. */
    const started: { provider: SandboxProvider; handle: SandboxHandle }[] = [];

    const make = (providerOptions: ContractProviderOptions = {}) => {
      const made = makeProvider(providerOptions);
      providers.push(made);
      return made;
    };

    const specFor = (
      label: string,
      overrides: Partial<SandboxSpec> = {},
      parent = folder,
    ): SandboxSpec => {
      const id = `${label}-${randomBytes(4).toString('hex')}`;
      const spec: SandboxSpec = {
        id,
        accessToken: randomBytes(24).toString('hex'),
        dir: join(parent, id),
        env: {},
        workdir: '/home/user',
        resources: {},
        network: 'none',
        ...overrides,
      };
      specs.push(spec);
      return spec;
    };

    const start = async (spec: SandboxSpec, by = provider): Promise<SandboxHandle> => {
      const handle = await by.create(spec);
      started.push({ provider: by, handle });
      return handle;
    };

    const leftovers = async (spec: SandboxSpec, handle?: SandboxHandle) =>
      options.leftovers(spec.id, spec.dir, handle);

    beforeAll(() => {
      folder = mkdtempSync(join(tmpdir(), 'abx-contract-'));
      provider = make();
    });

    afterEach(async () => {
      for (const { provider: by, handle } of started.splice(0)) {
        await by.kill(handle).catch(() => undefined);
      }
    });

    afterAll(async () => {
      for (const spec of specs) await options.removeLeftovers?.(spec.id, spec.dir);
      for (const made of providers) await made.close?.();
      if (folder) rmSync(folder, { recursive: true, force: true });
    });

    describe('a running sandbox', () => {
      let spec: SandboxSpec;
      let handle: SandboxHandle;
      let baseHome: string;
      const token = () => spec.accessToken;

      beforeAll(async () => {
        baseHome = join(folder, 'base-home');
        mkdirSync(baseHome);
        writeFileSync(join(baseHome, 'from-template.txt'), 'written by the template\n');
        // Set in the creating process: the sandbox must not inherit it.
        process.env.ABX_CONTRACT_HOST_ONLY = 'host environment';
        spec = specFor('shared', {
          baseHome,
          env: { GREETING: `it's a "value" with $HOME and spaces` },
          workdir: '/home/user/project',
          resources: { openFiles: 200, fileSize: MiB, disk: 64 * MiB, processes: 100 },
        });
        handle = await provider.create(spec);
      });

      afterAll(async () => {
        delete process.env.ABX_CONTRACT_HOST_ONLY;
        if (handle) await provider.kill(handle);
      });

      test('create resolves once envd answers /health, with a handle that survives JSON', async () => {
        // The first request after create: no retry, envd must be serving already.
        const health = await envdRequest(handle.envdSocket, token(), 'GET', '/health');
        expect(health).toEqual({ status: 200, body: { status: 'ok' } });
        expect(handle.provider).toBe(provider.name);
        // A path on the host, or a pod's address.
        expect(handle.envdSocket).toMatch(options.pod ? /^tcp:\/\// : /^\//);
        expect(handle.portsDir).toMatch(options.pod ? /^tcp:\/\// : /^\//);
        expect(JSON.parse(JSON.stringify(handle))).toEqual(handle);
      });

      test("runs commands as uid 1000 in the spec's workdir with the spec's environment only", async () => {
        const result = await sh(
          handle,
          token(),
          'id -u; id -un; pwd; printf "%s\\n" "$GREETING" "$HOME" "$ABX_SANDBOX_ID"; hostname; env',
        );
        const [uid, user, cwd, greeting, home, sandboxId, hostname] = result.stdout.split('\n');
        expect({ uid, user, cwd, greeting, home, sandboxId, hostname }).toEqual({
          uid: '1000',
          user: 'user',
          cwd: '/home/user/project',
          greeting: `it's a "value" with $HOME and spaces`,
          home: '/home/user',
          sandboxId: spec.id,
          hostname: options.pod?.hostname?.(handle) ?? spec.id,
        });
        expect(result.stdout).not.toContain('ABX_CONTRACT_HOST_ONLY');
      });

      test('refuses requests without its access token (401) and runs nothing for them', async () => {
        for (const wrong of ['wrong-token', '', `${token()}x`]) {
          const refused = await envdRequest<{ type?: string }>(
            handle.envdSocket,
            wrong,
            'POST',
            '/process/exec',
            { cmd: 'touch /home/user/project/ran-without-token' },
          );
          expect(refused.status).toBe(401);
          expect(refused.body.type).toBe('AuthenticationError');
        }
        const check = await sh(handle, token(), 'test -e ran-without-token && echo ran || echo no');
        expect(check.stdout).toBe('no\n');
      });

      test("keeps its access token out of its processes' environments and command lines", async () => {
        // Split so that no command line of the check holds the token whole.
        const half = token().length >> 1;
        const found = await sh(
          handle,
          token(),
          `a='${token().slice(0, half)}'; b='${token().slice(half)}'; printf '%s%s\\n' "$a" "$b" | grep -lsF -f - /proc/[0-9]*/environ /proc/[0-9]*/cmdline; true`,
        );
        expect(found.stdout).toBe('');
      });

      test('isAlive: true while it runs, also for a new provider given the stored handle; false for another start time', () => {
        expect(provider.isAlive(handle)).toBe(true);
        const stored = JSON.parse(JSON.stringify(handle)) as SandboxHandle;
        expect(make().isAlive(stored)).toBe(true);
        // The same pid with another start time is another process (the pid was reused).
        expect(provider.isAlive({ ...stored, startTime: `${stored.startTime}0` })).toBe(false);
      });

      test('a port inside is reachable at sandboxPortTarget (handle.portsDir/{port}.sock, or the pod address) once envd forwards it', async () => {
        await sh(handle, token(), "printf 'served from inside\\n' > served.txt");
        const server = await envdRequest(handle.envdSocket, token(), 'POST', '/process/start', {
          cmd: 'exec /usr/bin/python3 -m http.server 8123 --bind 127.0.0.1',
        });
        expect(server.status).toBe(200);
        const forwarded = await envdRequest(handle.envdSocket, token(), 'POST', '/ports/8123');
        expect(forwarded.status).toBe(200);
        const socket = sandboxPortTarget(handle, 8123);
        let answer: { status: number; body: string } | Error = new Error('not tried');
        for (const deadline = Date.now() + 10_000; Date.now() < deadline; await sleep(50)) {
          answer = await httpGet(socket, '/served.txt').catch((error: Error) => error);
          if (!(answer instanceof Error)) break;
        }
        expect(answer).toEqual({ status: 200, body: 'served from inside\n' });
      });

      test("has the SDK's layout: node on PATH, the runtime at /opt/abx, /run/abx/ports as handle.portsDir", async () => {
        const runtime = await sh(
          handle,
          token(),
          'command -v node > /dev/null && test -r /opt/abx/envd.cjs && test -r /opt/abx/server.cjs && echo ok',
        );
        expect(runtime.stdout).toBe('ok\n');
        // A pod's ports are reached at its address, through envd's forwarder (checked above).
        if (options.pod) return;
        // What the command server does: listen on the socket itself, no forwarding by envd.
        const server = await envdRequest(handle.envdSocket, token(), 'POST', '/process/start', {
          cmd: `exec node -e "require('http').createServer((q, s) => s.end('direct')).listen('/run/abx/ports/8124.sock')"`,
        });
        expect(server.status).toBe(200);
        const socket = join(handle.portsDir, '8124.sock');
        let answer: { status: number; body: string } | Error = new Error('not tried');
        for (const deadline = Date.now() + 10_000; Date.now() < deadline; await sleep(50)) {
          answer = await httpGet(socket, '/').catch((error: Error) => error);
          if (!(answer instanceof Error)) break;
        }
        expect(answer).toEqual({ status: 200, body: 'direct' });
      });

      test.skipIf(options.pod)(
        'applies resources: open files, file size, processes and disk',
        async () => {
          const limits = await sh(
            handle,
            token(),
            'ulimit -n; head -c 3000000 /dev/zero > big; wc -c < big; rm -f big; df -P -k /home/user | tail -n 1',
          );
          const [openFiles, written, disk] = limits.stdout.trim().split('\n');
          expect(Number(openFiles)).toBe(200);
          expect(Number(written)).toBe(MiB);
          // The home's file system is the disk quota's size where the provider enforces one. Where
          // it says it cannot (docker on a storage driver without quotas), df shows the host's disk:
          // isolation() must then report disk as not enforced, with a warning (checked below).
          const diskKiB = Number(disk?.split(/\s+/)[1]);
          if (provider.isolation().limits.disk?.enforced) {
            expect(diskKiB).toBeLessThanOrEqual(64 * 1024);
            expect(diskKiB).toBeGreaterThan(32 * 1024);
          } else {
            expect(provider.isolation().warnings.join('\n')).toMatch(/^disk: /m);
          }
          const forks = Number((await sh(handle, token(), FORK_UNTIL_REFUSED)).stdout);
          expect(forks).toBeGreaterThan(0);
          expect(forks).toBeLessThan(100);
        },
      );

      test('starts from a copy of baseHome, owned by the sandbox user', async () => {
        const result = await sh(
          handle,
          token(),
          'cat ~/from-template.txt; stat -c %u ~/from-template.txt; echo changed inside >> ~/from-template.txt && tail -n 1 ~/from-template.txt',
        );
        expect(result.stdout).toBe('written by the template\n1000\nchanged inside\n');
        expect(readFileSync(join(baseHome, 'from-template.txt'), 'utf8')).toBe(
          'written by the template\n',
        );
      });

      test.skipIf(options.pod)("network 'none': only its own loopback", async () => {
        const result = await sh(
          handle,
          token(),
          "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        );
        expect(result.stdout.split('\n').filter(Boolean)).toEqual(['lo']);
      });

      test.skipIf(options.pod)(
        'keeps the isolation promise inside: no capabilities, no user namespaces, no sysctl writes',
        async () => {
          const result = await sh(
            handle,
            token(),
            [
              'grep CapEff /proc/self/status',
              'command -v unshare > /dev/null || echo no unshare binary',
              'unshare -U true 2> /dev/null && echo user namespace made || echo no user namespace',
              '(echo x > /proc/sys/kernel/domainname) 2> /dev/null && echo sysctl written || echo sysctl refused',
            ].join('; '),
          );
          expect(result.stdout).toBe(
            'CapEff:\t0000000000000000\nno user namespace\nsysctl refused\n',
          );
        },
      );

      test('isolation() reports its mode and every limit, with a warning for each not enforced', () => {
        const report = provider.isolation();
        expect(report.mode).toBe(options.mode);
        // A provider that pauses says how (the freezer, SIGSTOP, `docker pause`), or that it
        // only hibernates (kubernetes).
        expect(Object.keys(report.limits).sort()).toEqual([
          'cpu',
          'disk',
          'egress',
          'file_size',
          'memory',
          'open_files',
          ...(provider.freeze || provider.hibernate ? ['pause'] : []),
          'processes',
          // A provider with volumes says whether their size is enforced.
          ...(provider.volumes ? ['volume_quota'] : []),
        ]);
        for (const [limit, { enforced, how }] of Object.entries(report.limits)) {
          expect(typeof enforced, limit).toBe('boolean');
          expect(how.length, limit).toBeGreaterThan(0);
          if (!enforced) expect(report.warnings.join('\n'), limit).toContain(limit);
        }
      });
    });

    describe('ending a sandbox', () => {
      test('kill (by a new provider, from the stored handle) ends every process, releases everything, and can be repeated', async () => {
        const spec = specFor('kill', { resources: { memory: 256 * MiB } });
        const handle = await start(spec);
        // Something that tries to outlive the sandbox: its own session, in the background.
        const detached = await envdRequest(
          handle.envdSocket,
          spec.accessToken,
          'POST',
          '/process/start',
          {
            cmd: 'setsid sleep 600 & sleep 600',
          },
        );
        expect(detached.status).toBe(200);
        expect(await leftovers(spec, handle)).not.toEqual([]);

        const stored = JSON.parse(JSON.stringify(handle)) as SandboxHandle;
        const restarted = make();
        await restarted.kill(stored);
        expect(restarted.isAlive(stored)).toBe(false);
        expect(provider.isAlive(handle)).toBe(false);
        expect(await leftovers(spec, handle)).toEqual([]);
        await expect(
          envdRequest(handle.envdSocket, spec.accessToken, 'GET', '/health', undefined, 2000),
        ).rejects.toThrow();

        await expect(restarted.kill(stored)).resolves.toBeUndefined();
        await expect(provider.kill(handle)).resolves.toBeUndefined();
        expect(await leftovers(spec, handle)).toEqual([]);
      });

      test("a sandbox whose processes end by themselves is not alive, ended 'exited', and kill cleans up", async () => {
        const spec = specFor('exit', { resources: { memory: 256 * MiB } });
        const handle = await start(spec);
        if (options.pod) await options.pod.crash(handle);
        else {
          await envdRequest(handle.envdSocket, spec.accessToken, 'POST', '/process/exec', {
            cmd: 'kill -9 -1',
          }).catch(() => undefined); // envd dies while answering
        }
        expect(
          await settle(
            () => provider.isAlive(handle),
            (alive) => !alive,
          ),
        ).toBe(false);
        expect(provider.endCause(handle)).toBe('exited');
        await expect(provider.kill(handle)).resolves.toBeUndefined();
        expect(await leftovers(spec, handle)).toEqual([]);
      });

      test("a sandbox whose envd the OOM killer ends (resources.memory) is not alive and ended 'oom'", async ({
        skip,
      }) => {
        if (options.pod) skip("the API double's kubelet has no OOM killer");
        if (!provider.isolation().limits.memory?.enforced) {
          skip('memory limits are not enforced on this host');
        }
        const spec = specFor('oom', { resources: { memory: 64 * MiB } });
        const handle = await start(spec);
        // envd made the OOM killer's first choice ($PPID: the shell's parent), then memory runs out.
        await envdRequest(handle.envdSocket, spec.accessToken, 'POST', '/process/exec', {
          cmd: 'echo 1000 > /proc/$PPID/oom_score_adj && /usr/bin/python3 -c "x = bytearray(1 << 30)"',
          timeout: 20,
        }).catch(() => undefined);
        expect(
          await settle(
            () => provider.isAlive(handle),
            (alive) => !alive,
            15_000,
          ),
        ).toBe(false);
        expect(provider.endCause(handle)).toBe('oom');
        await expect(provider.kill(handle)).resolves.toBeUndefined();
        expect(await leftovers(spec, handle)).toEqual([]);
      });

      test('sweepOrphans kills the sandboxes of its folder not in `running`, returns their ids, and leaves the others alone', async () => {
        const dir = join(folder, 'sweep');
        mkdirSync(dir);
        const orphan = specFor('orphan', {}, dir);
        const kept = specFor('kept', {}, dir);
        const orphanHandle = await start(orphan);
        const keptHandle = await start(kept);

        // What the daemon does at start, with the ids its registry knows as running.
        const swept = await make().sweepOrphans(dir, new Set([kept.id]));
        expect(swept).toEqual([orphan.id]);
        expect(
          await settle(
            () => provider.isAlive(orphanHandle),
            (alive) => !alive,
          ),
        ).toBe(false);
        expect(
          await settle(
            () => leftovers(orphan),
            (left) => left.length === 0,
          ),
        ).toEqual([]);
        expect(provider.isAlive(keptHandle)).toBe(true);
        const health = await envdRequest(keptHandle.envdSocket, kept.accessToken, 'GET', '/health');
        expect(health.status).toBe(200);
      });
    });

    describe('a create that fails', () => {
      test('rejects with a SandboxStartError naming the sandbox and the cause, and leaves nothing behind', async () => {
        // A workdir that cannot be made: /proc has no room for new folders.
        const spec = specFor('bad-workdir', { workdir: '/proc/abx-contract-no-such-dir' });
        const error = await start(spec).catch((thrown: unknown) => thrown);
        expect(error).toBeInstanceOf(SandboxStartError);
        expect((error as Error).message).toContain(spec.id);
        expect((error as Error).message).toContain(spec.workdir);
        expect(await leftovers(spec)).toEqual([]);
      });

      test("rejects when envd does not answer within the provider's start timeout, and leaves nothing behind", async () => {
        // Each timeout ends the start at another point: before, during and after the launch.
        const left: Record<string, string[]> = {};
        let rejected = 0;
        for (const ms of [1, 5, 10, 20, 50]) {
          const spec = specFor(`slow${ms}`);
          const error = await start(spec, make({ startTimeoutMs: ms })).then(
            () => undefined, // this host started it that fast; afterEach kills it
            (thrown: unknown) => thrown,
          );
          if (!error) continue;
          rejected++;
          expect(error).toBeInstanceOf(SandboxStartError);
          expect((error as Error).message).toContain(spec.id);
          expect((error as Error).message).toMatch(new RegExp(`\\b${ms} ?ms\\b`));
          left[`${ms} ms`] = await leftovers(spec);
        }
        expect(rejected).toBeGreaterThan(0);
        expect(left).toEqual(Object.fromEntries(Object.keys(left).map((key) => [key, []])));
      });
    });
  });
}
