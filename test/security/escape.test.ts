import { createSocket } from 'node:dgram';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { orphanNetProcesses } from '../../src/egress/sandbox-net.js';
import { Sandbox, Templates } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { CLI, runProgram } from '../cli/abx.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { FORK_BOMB } from '../helpers/attacks.js';
import { ROOT } from '../helpers/build.js';
import { envdPid } from '../helpers/envd-stopped.js';
import { internetUnavailable } from '../helpers/internet.js';
import { startRootlessDaemon } from '../helpers/rootless.js';

// An attacker's view: code inside a sandbox tries to reach the host, other sandboxes and its own
// limits. The same attacks run against a root daemon (each sandbox a host uid of its own) and a
// rootless one (an unprivileged uid, with cgroups delegated to it as docs/security.md describes).

const IS_ROOT = process.getuid?.() === 0;
const LIMITS = join(ROOT, 'test', 'fixtures', 'templates', 'hostile-limits.yaml');
const CGROUP = '/sys/fs/cgroup';

interface Installation {
  home: string;
  close(): Promise<void>;
  /** The host uid sandboxes must run as, when fixed (rootless: the daemon's). */
  uid?: number;
}

const modes: [string, () => Promise<Installation>][] = [
  ['root daemon', () => createAbxHome()],
  ['rootless daemon', () => startRootlessDaemon({ delegateCgroups: true })],
];

/** Runs a shell command in the sandbox; a non-zero exit is a result, not an error. */
function sh(box: Sandbox, command: string, timeoutMs = 30_000) {
  return box.commands.run(command, { timeoutMs, allowNonZeroExit: true });
}

/** Runs Python in the sandbox (Debian's, from the host's read-only /usr). */
async function python(box: Sandbox, code: string, timeoutMs = 30_000) {
  return box.commands.run('/usr/bin/python3 -c "$CODE"', {
    envs: { CODE: code },
    timeoutMs,
    allowNonZeroExit: true,
  });
}

/**
 * Makes envd the OOM killer's first choice: pid 2, or, where envd sleeps when idle, pid 2's
 * child (pid 2 is then the shell loop envd runs under: docs/providers.md).
 */
const ENVD_OOM_FIRST =
  'e=2; case "$(readlink /proc/2/exe)" in */sh|*/dash|*/bash) e=$(cut -d" " -f1 /proc/2/task/2/children);; esac; echo 1000 > /proc/$e/oom_score_adj';

/**
 * Then the memory limit exhausted by four processes that allocate without end: the OOM killer
 * takes the process with the highest score first, and envd's (its adjustment adds the whole
 * limit) is above each of theirs even where envd itself is small (its front); one process
 * holding nearly all the limit alone would score higher and be taken instead. The others are
 * taken in turn as they grow, and the sandbox has nothing left.
 */
const OOM_ATTACK = `${ENVD_OOM_FIRST} && for i in 1 2 3 4; do /usr/bin/python3 -c "x = [bytearray(4 << 20) for _ in iter(int, 1)]" & done; wait`;

/** The real host uid a sandbox's processes run as, read from the host. */
function hostUid(sandboxId: string): number {
  const status = readFileSync(`/proc/${envdPid(sandboxId)}/status`, 'utf8');
  return Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
}

async function waitFor<T>(what: () => Promise<T> | T, ok: (value: T) => boolean, ms = 15_000) {
  const deadline = Date.now() + ms;
  let value = await what();
  while (!ok(value) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    value = await what();
  }
  return value;
}

/** Host cgroup folders named after a sandbox, in any hierarchy. */
function cgroupsNamed(sandboxId: string): string[] {
  const found: string[] = [];
  const walk = (dir: string, depth: number) => {
    if (depth > 3) return;
    let entries: string[];
    try {
      entries = readdirSync(dir);
    } catch {
      return;
    }
    for (const name of entries) {
      const path = join(dir, name);
      try {
        if (!statSync(path).isDirectory()) continue;
      } catch {
        continue;
      }
      if (name === sandboxId) found.push(path);
      else if (name.startsWith('abx') || depth === 0) walk(path, depth + 1);
    }
  };
  walk(CGROUP, 0);
  return found;
}

describe.runIf(IS_ROOT).each(modes)('escape attempts against a %s', (mode, install) => {
  let abx: Installation;
  let home: string;
  let box: Sandbox;
  let limitsDir: string | undefined;

  beforeAll(async () => {
    abx = await install();
    home = abx.home;
    // A copy any uid may read: a rootless daemon cannot enter a checkout under /root.
    limitsDir = mkdtempSync(join(tmpdir(), 'abx-escape-limits-'));
    chmodSync(limitsDir, 0o755);
    copyFileSync(LIMITS, join(limitsDir, 'template.yaml'));
    await Templates.build(join(limitsDir, 'template.yaml'), { home });
    box = await Sandbox.create({ home, template: 'hostile-limits' });
  }, 180_000);

  afterAll(async () => {
    await box?.kill().catch(() => undefined);
    await abx?.close();
    if (limitsDir) rmSync(limitsDir, { recursive: true, force: true });
  });

  test('abx daemon status says the mode and that every limit holds here', async () => {
    const status = await runProgram(process.execPath, [CLI, 'daemon', 'status'], {
      env: { ABX_HOME: home },
    });
    expect(status.code).toBe(0);
    expect(status.stdout).toContain(
      mode === 'root daemon' ? 'isolation: root mode' : 'isolation: rootless mode',
    );
    for (const limit of ['processes', 'memory', 'cpu']) {
      expect(status.stdout).toMatch(new RegExp(`${limit}\\s+enforced`));
    }
    expect(status.stdout).toMatch(/disk\s+enforced/);
  });

  test('the sandbox is never host root: its uid maps to an unprivileged host uid', async () => {
    const { stdout } = await sh(box, 'id -u');
    expect(stdout.trim()).toBe('1000');
    const uid = hostUid(box.sandboxId);
    expect(uid).not.toBe(0);
    if (abx.uid !== undefined) expect(uid).toBe(abx.uid);
    else expect(uid).toBeGreaterThanOrEqual(1_500_000_000);
    // What it writes in its home belongs to that uid on the host.
    await box.files.write('mine.txt', 'x');
    const onHost = statSync(`/proc/${envdPid(box.sandboxId)}/root/home/user/mine.txt`);
    expect(onHost.uid).toBe(uid);
  });

  test.skipIf(mode !== 'root daemon')(
    'two sandboxes of a root daemon run as different host uids',
    async () => {
      const other = await Sandbox.create({ home });
      try {
        expect(hostUid(other.sandboxId)).not.toBe(hostUid(box.sandboxId));
      } finally {
        await other.kill();
      }
    },
  );

  test('host-only files stay unreadable, by shell and through the file API', async () => {
    const shell = await sh(box, 'cat /etc/shadow; ls /root');
    expect(shell.exitCode).not.toBe(0);
    expect(shell.stdout).toBe('');
    expect(shell.stderr).toMatch(/Permission denied/);
    await sh(box, 'ln -sf /etc/shadow /home/user/shadow-link');
    await expect(box.files.read('shadow-link')).rejects.toThrow();
  });

  test('kernel surfaces are read-only or absent: /proc/sys, sysrq, /sys', async () => {
    const before = readFileSync('/proc/sys/kernel/core_pattern', 'utf8');
    const probe = await sh(
      box,
      [
        'echo "|/home/user/x.sh" > /proc/sys/kernel/core_pattern; echo "sysctl=$?"',
        'echo 1 > /proc/sys/vm/drop_caches; echo "drop=$?"',
        'if [ -e /proc/sysrq-trigger ]; then echo h > /proc/sysrq-trigger; echo "sysrq=$?"; fi',
        'ls /sys; echo "sys=$?"',
        'cat /proc/keys | wc -c',
      ].join('\n'),
    );
    expect(probe.stdout).toMatch(/sysctl=[1-9]/);
    expect(probe.stdout).toMatch(/drop=[1-9]/);
    expect(probe.stdout).not.toMatch(/sysrq=0/);
    expect(probe.stdout).toMatch(/sys=[1-9]/);
    expect(probe.stdout.trim().split('\n').at(-1)).toBe('0');
    expect(readFileSync('/proc/sys/kernel/core_pattern', 'utf8')).toBe(before);
  });

  test('no nested user namespaces, no mounts, no cgroupfs; seccomp refuses kernel APIs', async () => {
    const probe = await sh(
      box,
      [
        'unshare -r id; echo "unshare-r=$?"',
        'unshare -U true; echo "unshare-U=$?"',
        'mkdir -p /tmp/cg; mount -t cgroup -o memory cg /tmp/cg; echo "mount=$?"',
        'grep -c . /proc/self/mountinfo >/dev/null; grep "^Seccomp:" /proc/self/status',
      ].join('\n'),
    );
    expect(probe.stdout).toMatch(/unshare-r=[1-9]/);
    expect(probe.stdout).toMatch(/unshare-U=[1-9]/);
    expect(probe.stdout).toMatch(/mount=[1-9]/);
    expect(probe.stdout).toMatch(/Seccomp:\s+2/);
    const calls = await python(
      box,
      [
        'import ctypes, os',
        'libc = ctypes.CDLL(None, use_errno=True)',
        // x86_64 numbers: keyctl 250, bpf 321, perf_event_open 298, unshare 272, setns 308
        'for name, nr, args in [("keyctl", 250, (0,)), ("bpf", 321, (0, 0, 0)), ("perf_event_open", 298, (0, 0, -1, -1, 0)), ("unshare", 272, (0x10000000,)), ("setns", 308, (0, 0))]:',
        '    r = libc.syscall(nr, *args)',
        '    print(name, r, os.strerror(ctypes.get_errno()))',
      ].join('\n'),
    );
    for (const name of ['keyctl', 'bpf', 'perf_event_open', 'unshare', 'setns']) {
      expect(calls.stdout).toContain(`${name} -1 Operation not permitted`);
    }
  });

  test('a fork bomb stops at resources.processes', async () => {
    const bomb = await python(box, FORK_BOMB);
    const [forked, refused, alive] = bomb.stdout.trim().split(' ').map(Number);
    expect(forked).toBeGreaterThan(5);
    expect(refused).toBeGreaterThan(0);
    expect(alive).toBeLessThanOrEqual(64);
    expect((await sh(box, 'echo alive')).stdout).toBe('alive\n');
  });

  test('memory stops at resources.memory and the sandbox cannot raise it', async () => {
    const hog = await python(box, 'x = bytearray(512 * 1024 * 1024)\nprint("allocated")');
    expect(hog.stdout).not.toContain('allocated');
    expect(hog.exitCode).not.toBe(0);
    expect((await sh(box, 'echo alive')).stdout).toBe('alive\n');
    // The limit lives in a cgroup owned by the daemon's uid, out of the sandbox's sight.
    const raise = await sh(
      box,
      'cat /proc/self/cgroup; ls /sys/fs/cgroup/memory 2>&1; echo $((1<<30)) > /sys/fs/cgroup/memory/memory.limit_in_bytes; echo "raise=$?"',
    );
    expect(raise.stdout).toMatch(/raise=[1-9]/);
    const dirs = cgroupsNamed(box.sandboxId).filter((dir) => dir.includes('/memory/'));
    expect(dirs.length).toBe(1);
    const limit = Number(readFileSync(join(dirs[0] as string, 'memory.limit_in_bytes'), 'utf8'));
    expect(limit).toBe(192 * 1024 ** 2);
    // Root mode: not even the sandbox's uid may write it. Rootless: the daemon's uid (the
    // sandbox's too) owns it, and the sandbox has no way to reach cgroupfs (checked above).
    if (mode === 'root daemon') {
      expect(statSync(join(dirs[0] as string, 'memory.limit_in_bytes')).uid).not.toBe(
        hostUid(box.sandboxId),
      );
    }
  });

  test('two busy loops get at most resources.cpu (0.5 core) of CPU time', async () => {
    const run = await python(
      box,
      [
        'import os, time',
        'start = time.time()',
        'pids = []',
        'for _ in range(2):',
        '    pid = os.fork()',
        '    if pid == 0:',
        '        end = time.time() + 2',
        '        while time.time() < end: pass',
        '        os._exit(0)',
        '    pids.append(pid)',
        'for pid in pids: os.waitpid(pid, 0)',
        't = os.times()',
        'print((t.children_user + t.children_system) / (time.time() - start))',
      ].join('\n'),
    );
    const share = Number(run.stdout.trim());
    expect(share).toBeGreaterThan(0.05);
    // The quota is an upper bound whatever else the host does; a period's slack on top.
    expect(share).toBeLessThanOrEqual(0.5 * 1.2);
  });

  test('the disk quota holds for home and /tmp: ENOSPC inside, nothing outside', async () => {
    if (mode === 'rootless daemon') {
      // Rootless: the home and /tmp are tmpfs mounts of the quota's size each.
      for (const dir of ['/home/user', '/tmp']) {
        const fill = await sh(box, `dd if=/dev/zero of=${dir}/fill bs=1M count=100 status=none`);
        expect(fill.stderr).toMatch(/No space left on device/);
        const used = await sh(box, `du -k ${dir}/fill | cut -f1; rm -f ${dir}/fill`);
        expect(Number(used.stdout.trim())).toBeLessThanOrEqual(64 * 1024);
      }
      expect((await box.files.write('after.txt', 'ok')).size).toBe(2);
      return;
    }
    // Root: one disk image holds both, so together they stop at the quota.
    const fill = await sh(
      box,
      'dd if=/dev/zero of=/home/user/fill bs=1M count=40 status=none; echo "home=$?"; dd if=/dev/zero of=/tmp/fill bs=1M count=40 status=none; echo "tmp=$?"; df -k /home/user | tail -1',
      30_000,
    );
    expect(fill.stdout).toMatch(/home=0/);
    expect(fill.stdout).toMatch(/tmp=[1-9]/);
    expect(fill.stderr).toMatch(/No space left on device/);
    const image = join(home, 'sandboxes', box.sandboxId, 'disk.img');
    // Blocks the image really takes on the host's disk: about the quota, never more.
    expect(statSync(image).blocks * 512).toBeLessThanOrEqual(70 * 1024 ** 2);
    await sh(box, 'rm -f /home/user/fill /tmp/fill');
    expect((await box.files.write('after.txt', 'ok')).size).toBe(2);
  });

  test('a template’s setup output reaches new sandboxes writable, without set-id bits', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-escape-tpl-'));
    chmodSync(dir, 0o755); // a rootless daemon reads it too
    try {
      const file = join(dir, 'template.yaml');
      writeFileSync(
        file,
        [
          'name: setid-setup',
          'setup:',
          '  - mkdir -p data && echo built > data/marker && ln -s /etc/hostname data/link',
          '  - cp /bin/sh ./shell && chmod 4755 ./shell && chmod 2775 data',
          '  - mkfifo pipe',
        ].join('\n'),
      );
      await Templates.build(file, { home });
      const built = join(home, 'templates', 'setid-setup', 'home');
      expect(statSync(join(built, 'shell')).mode & 0o7777).toBe(0o755);
      expect(statSync(join(built, 'data')).mode & 0o7000).toBe(0);
      expect(existsSync(join(built, 'pipe'))).toBe(false);
      const fresh = await Sandbox.create({ home, template: 'setid-setup' });
      try {
        const seen = await sh(
          fresh,
          'cat data/marker; readlink data/link; stat -c "%a %u" shell; echo more >> data/marker && echo writable',
        );
        expect(seen.stdout).toBe('built\n/etc/hostname\n755 1000\nwritable\n');
      } finally {
        await fresh.kill();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('the host layout is not advertised: no $ABX_HOME path in its pid 1 or its mounts', async () => {
    const { stdout } = await sh(box, 'tr "\\0" " " < /proc/1/cmdline; cat /proc/self/mountinfo');
    expect(stdout).toContain('bwrap');
    expect(stdout).toContain(' /run/abx ');
    expect(stdout).not.toContain(home);
  });

  test('the socket folder is a small tmpfs of its own: filling it touches nothing on the host', async () => {
    const fill = await sh(box, 'dd if=/dev/zero of=/run/abx/fill bs=1M count=50 status=none');
    expect(fill.stderr).toMatch(/No space left on device/);
    await sh(box, 'rm -f /run/abx/fill');
    expect((await sh(box, 'echo still served')).stdout).toBe('still served\n');
  });

  test('reopening envd’s output through /proc cannot flood the host’s log', async () => {
    const log = join(home, 'sandboxes', box.sandboxId, 'sandbox.log');
    const flood = await sh(
      box,
      'head -c 8388608 /dev/zero > /proc/2/fd/1 && echo wrote; head -c 8388608 /dev/zero > /proc/2/fd/2 && echo wrote',
    );
    // Root: the log belongs to root, the sandbox's uid may not open it. Rootless: envd's output
    // is a socket to a reader outside the sandbox (which keeps the first MiB only, should a
    // ptrace'd envd write there), and a socket cannot be reopened through /proc.
    expect(flood.stdout).toBe('');
    expect(flood.stderr).toMatch(
      mode === 'root daemon' ? /Permission denied/ : /No such device or address/,
    );
    await new Promise((r) => setTimeout(r, 300));
    expect(statSync(log).size).toBeLessThanOrEqual(1024 * 1024);
    expect((await sh(box, 'echo still served')).stdout).toBe('still served\n');
  });

  test('a sandbox that kills itself is marked dead and leaves nothing behind', async () => {
    const victim = await Sandbox.create({ home, template: 'hostile-limits' });
    const id = victim.sandboxId;
    const uid = hostUid(id);
    expect(cgroupsNamed(id).length).toBeGreaterThan(0);
    await sh(victim, 'kill -9 -1', 5000).catch(() => undefined);
    const info = await waitFor(
      () => victim.getInfo(),
      (i) => i.state !== 'running',
    );
    expect([info.state, info.endReason]).toEqual(['dead', 'exited']);
    await waitFor(
      () => existsSync(join(home, 'sandboxes', id)),
      (there) => !there,
    );
    expect(existsSync(join(home, 'sandboxes', id))).toBe(false);
    expect(sandboxProcesses(id)).toEqual([]);
    expect(cgroupsNamed(id)).toEqual([]);
    if (mode === 'root daemon') expect(existsSync(`/run/abx-uids/${uid}`)).toBe(false);
    // Killing it now cleans up (nothing left) and succeeds.
    await expect(Sandbox.kill(id, { home })).resolves.toBe(false);
  });

  test('a sandbox whose envd the OOM killer ends is marked dead (oom) and cleaned up', async () => {
    const victim = await Sandbox.create({ home, template: 'hostile-limits' });
    const id = victim.sandboxId;
    // The attacker makes envd the OOM killer's first choice, then exhausts the memory limit.
    await victim.commands
      .run(OOM_ATTACK, {
        timeoutMs: 20_000,
      })
      .catch(() => undefined);
    const info = await waitFor(
      () => victim.getInfo(),
      (i) => i.state !== 'running',
    );
    expect([info.state, info.endReason]).toEqual(['dead', 'oom']);
    await waitFor(
      () => cgroupsNamed(id).length + (existsSync(join(home, 'sandboxes', id)) ? 1 : 0),
      (n) => n === 0,
    );
    expect(cgroupsNamed(id)).toEqual([]);
    expect(existsSync(join(home, 'sandboxes', id))).toBe(false);
    expect(sandboxProcesses(id)).toEqual([]);
  });
});

/**
 * An attacker in a sandbox on the `internet` network with no policy (everything allowed but the
 * always-denied ranges), the egress the daemon's own namespace, as outside tests (the daemons of
 * other tests egress into namespaces with no route). Every attack aims
 * at this host's loopback (the daemon's API and gateway, a trap server on 127.0.0.1 that counts
 * what reaches it) or at another sandbox's egress ports, so a failure reaches nothing beyond this
 * machine; no name is looked up.
 */
const hostEgressModes: [string, () => Promise<Installation>][] = [
  [
    'root daemon',
    async () => {
      const abx = await createAbxHome();
      const given = process.env.ABX_EGRESS_NETNS;
      delete process.env.ABX_EGRESS_NETNS;
      try {
        await startDaemon(abx.home);
      } finally {
        if (given) process.env.ABX_EGRESS_NETNS = given;
      }
      return abx;
    },
  ],
  ['rootless daemon', () => startRootlessDaemon({ delegateCgroups: true, hostEgress: true })],
];

describe.skipIf(internetUnavailable()).each(hostEgressModes)(
  'escape attempts from an internet sandbox against a %s',
  (_mode, install) => {
    let abx: Installation;
    let box: Sandbox;
    let other: Sandbox;
    const trapped: string[] = [];
    const trap = createServer((socket) => {
      trapped.push(`tcp ${socket.remoteAddress}`);
      socket.destroy();
    });
    const udpTrap = createSocket('udp4');
    let ports: { api: number; gateway: number; trap: number; udp: number };
    let limitsDir: string | undefined;

    beforeAll(async () => {
      abx = await install();
      await new Promise<void>((resolve) => trap.listen(0, '127.0.0.1', resolve));
      await new Promise<void>((resolve) => udpTrap.bind(0, '127.0.0.1', resolve));
      udpTrap.on('message', (_m, from) => trapped.push(`udp ${from.address}`));
      limitsDir = mkdtempSync(join(tmpdir(), 'abx-escape-limits-'));
      chmodSync(limitsDir, 0o755);
      copyFileSync(LIMITS, join(limitsDir, 'template.yaml'));
      await Templates.build(join(limitsDir, 'template.yaml'), { home: abx.home });
      box = await Sandbox.create({ home: abx.home, allowInternetAccess: true });
      other = await Sandbox.create({ home: abx.home, allowInternetAccess: true });
      const info = JSON.parse(readFileSync(join(abx.home, 'daemon.json'), 'utf8'));
      ports = {
        api: Number(new URL(info.apiUrl).port),
        gateway: Number(new URL(info.gatewayUrl).port),
        trap: (trap.address() as AddressInfo).port,
        udp: udpTrap.address().port,
      };
    }, 180_000);

    afterAll(async () => {
      await box?.kill().catch(() => undefined);
      await other?.kill().catch(() => undefined);
      await abx?.close();
      trap.close();
      udpTrap.close();
      if (limitsDir) rmSync(limitsDir, { recursive: true, force: true });
    });

    test('the host loopback is out of reach by every spelling, directly and through the proxy', async () => {
      const hosts = [
        '127.0.0.1',
        '10.0.2.2',
        'localhost',
        '[::1]',
        '2130706433',
        '0x7f000001',
      ].concat(['127.1', '0.0.0.0', '[::ffff:127.0.0.1]', 'api.localhost']);
      const script = Object.values({ a: ports.api, g: ports.gateway, t: ports.trap })
        .flatMap((port) =>
          hosts.map((host) => {
            const url = `http://${host}:${port}/`;
            const code = `-s -o /dev/null -m 5 -w '%{http_code} %header{x-abx-egress}\\n'`;
            return [
              `echo "direct ${url} $(env -u http_proxy curl ${code} ${url})"`,
              `echo "proxy ${url} $(curl ${code} --noproxy '' -x "$HTTP_PROXY" ${url})"`,
              `echo "tunnel ${url} $(curl ${code} --noproxy '' -p -x "$HTTP_PROXY" ${url})"`,
            ].join('\n');
          }),
        )
        .join('\n');
      const { stdout } = await sh(box, script, 240_000);
      const lines = stdout.trim().split('\n');
      expect(lines).toHaveLength(3 * 3 * hosts.length);
      for (const line of lines) {
        // Refused: no connection (000), or the egress proxy's own 403.
        expect(line).toMatch(/ (000 ?|403 refused)$/);
      }
      expect(trapped).toEqual([]);
    });

    test('a Host header or TLS server name naming the loopback is refused by name', async () => {
      // 198.51.100.7 is never dialled: the proxy decides by the name, and refuses it.
      const lies = [
        `curl -s -m 5 -H 'Host: 127.0.0.1:${ports.api}' http://198.51.100.7/v1/sandboxes`,
        `curl -s -m 5 -H 'Host: localhost:${ports.trap}' http://198.51.100.7/`,
        `curl -s -m 5 -k --resolve localhost:443:198.51.100.7 https://localhost/`,
      ].map((c) => `env -u http_proxy -u https_proxy ${c}; echo " exit $?"`);
      const { stdout } = await sh(box, lies.join('\n'), 60_000);
      expect(stdout).not.toMatch(/sandboxId|"error"/);
      expect(stdout.match(/refused/g)?.length).toBe(2);
      expect(stdout).toMatch(/exit 35/); // TLS: the access_denied alert
      expect(trapped).toEqual([]);
    });

    test("another sandbox's egress ports are shut to this one", async () => {
      const theirs = Number(new URL((await sh(other, 'echo $HTTP_PROXY')).stdout.trim()).port);
      const ours = Number(new URL((await sh(box, 'echo $HTTP_PROXY')).stdout.trim()).port);
      expect(theirs).not.toBe(ours);
      const direct = await sh(
        box,
        `env -u http_proxy curl -s -m 5 -o /dev/null -w '%{http_code}' http://10.0.2.2:${theirs}/`,
      );
      expect(direct.stdout).toBe('000');
      const asProxy = await sh(
        box,
        `curl -s -m 5 -o /dev/null -w '%{http_code}' --noproxy '' -x http://10.0.2.2:${theirs} http://127.0.0.1:${ports.trap}/`,
      );
      expect(asProxy.stdout).toBe('000');
      expect(trapped).toEqual([]);
    });

    test('no raw sockets, no ICMP, and no UDP but DNS (which egress answers)', async () => {
      const { stdout } = await python(
        box,
        [
          'import socket',
          'def attempt(what, make, send):',
          '    try:',
          '        s = make()',
          '        send(s)',
          '        print(what, "sent")',
          '    except OSError as e:',
          '        print(what, "refused", e.errno)',
          'attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), lambda s: s.sendto(b"\\x08\\0\\0\\0\\0\\0\\0\\0", ("10.0.2.2", 0)))',
          'attempt("icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), lambda s: s.sendto(b"\\x08\\0\\0\\0\\0\\0\\0\\0", ("10.0.2.2", 0)))',
          `attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM), lambda s: s.sendto(b"x", ("10.0.2.2", ${ports.udp})))`,
          `attempt("udp-loopback", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM), lambda s: s.sendto(b"x", ("127.0.0.1", ${ports.udp})))`,
        ].join('\n'),
      );
      expect(stdout).toMatch(/^raw refused/m);
      expect(stdout).toMatch(/^icmp refused/m);
      expect(stdout).toMatch(/^udp refused/m);
      // The sandbox's own loopback is its own: the host's trap hears nothing of it.
      await new Promise((r) => setTimeout(r, 200));
      expect(trapped).toEqual([]);
      const dns = await sh(box, 'getent hosts api.localhost; echo "exit $?"');
      expect(dns.stdout).not.toContain('127.0.0.1');
    });

    test('the network of a sandbox that dies of OOM, or kills itself, is gone with it', async () => {
      for (const how of ['oom', 'kill']) {
        const victim = await Sandbox.create({
          home: abx.home,
          template: 'hostile-limits',
          network: { denyOut: ['0.0.0.0/0'] },
        });
        const id = victim.sandboxId;
        expect(orphanNetProcesses((x) => x === id).length).toBe(2);
        const attack = how === 'oom' ? OOM_ATTACK : 'kill -9 -1';
        await victim.commands.run(attack, { timeoutMs: 20_000 }).catch(() => undefined);
        const info = await waitFor(
          () => victim.getInfo(),
          (i) => i.state !== 'running',
        );
        expect([info.state, info.endReason]).toEqual(['dead', how === 'oom' ? 'oom' : 'exited']);
        await waitFor(
          () => orphanNetProcesses((x) => x === id).length,
          (n) => n === 0,
        );
        expect(orphanNetProcesses((x) => x === id)).toEqual([]);
      }
    });
  },
);

describe.runIf(IS_ROOT)('a rootless daemon without delegated cgroups', () => {
  let abx: Installation;
  let limitsDir: string | undefined;

  beforeAll(async () => {
    abx = await startRootlessDaemon({ delegateCgroups: false });
    limitsDir = mkdtempSync(join(tmpdir(), 'abx-escape-limits-'));
    chmodSync(limitsDir, 0o755);
    copyFileSync(LIMITS, join(limitsDir, 'template.yaml'));
  }, 60_000);

  afterAll(async () => {
    await abx?.close();
    if (limitsDir) rmSync(limitsDir, { recursive: true, force: true });
  });

  test('says which limits do not hold, in daemon status and in the sandbox’s log', async () => {
    const status = await runProgram(process.execPath, [CLI, 'daemon', 'status'], {
      env: { ABX_HOME: abx.home },
    });
    expect(status.stdout).toContain('isolation: rootless mode');
    for (const limit of ['processes', 'memory', 'cpu']) {
      expect(status.stdout).toMatch(new RegExp(`${limit}\\s+NOT enforced`));
    }
    expect(status.stdout).toMatch(/warning: memory: not enforced/);
    await Templates.build(join(limitsDir as string, 'template.yaml'), { home: abx.home });
    const box = await Sandbox.create({ home: abx.home, template: 'hostile-limits' });
    try {
      const log = readFileSync(join(abx.home, 'sandboxes', box.sandboxId, 'sandbox.log'), 'utf8');
      expect(log).toMatch(/no writable memory, cpu, pids cgroup .* not enforced/);
      // What holds without cgroups still holds: never root, no user namespaces, the disk quota.
      expect(hostUid(box.sandboxId)).toBe(abx.uid);
      const probe = await sh(
        box,
        'unshare -r true; echo "userns=$?"; dd if=/dev/zero of=/tmp/f bs=1M count=100 status=none; echo "dd=$?"',
      );
      expect(probe.stdout).toMatch(/userns=[1-9]/);
      expect(probe.stdout).toMatch(/dd=[1-9]/);
    } finally {
      await box.kill();
    }
  });
});
