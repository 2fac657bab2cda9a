import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { buildSync } from 'esbuild';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { EgressController } from '../../src/egress/controller.js';
import { importFolder } from '../../src/providers/docker/import-folder.js';
import { imageRootfs } from '../../src/providers/local/image-rootfs.js';
import { LocalProvider } from '../../src/providers/local/local-provider.js';
import { rootUidOf } from '../../src/providers/local/root-userns.js';
import type { SandboxHandle, SandboxSpec, VolumeSpec } from '../../src/providers/provider.js';
import { connectSandboxSocket } from '../../src/providers/sandbox-socket.js';
import {
  busyboxRoot,
  DEBIAN_IMAGE,
  dockerEngine,
  ensureDebianImage,
} from '../helpers/docker-images.js';
import { asHostUid } from '../helpers/host-ns.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';
import { rootlessUid } from '../helpers/rootless.js';

// An attacker who IS root inside a root-allowing image sandbox (issue 46) tries to get out: as
// root's envd runs it and as the default user's `sudo` does. Each way out must be refused and
// leave the host as it was. One sandbox does the attacking (on the test internet, with a volume);
// a second from the same image is the neighbour it must not reach. The attacks are
// test/fixtures/root-escape.py, one probe per way out, each in a child of its own.

const IS_ROOT = process.getuid?.() === 0;
const engine = IS_ROOT ? await dockerEngine() : { reason: 'not root' };
const ROOT = join(import.meta.dirname, '..', '..');
const ATTACKS = readFileSync(join(ROOT, 'test', 'fixtures', 'root-escape.py'), 'utf8');
/** CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE (ROOT_CAPS). */
const ROOT_CAP_MASK = 0x5fbn;
const EXEC_TIMEOUT_S = 60;

interface Exec {
  stdout: string;
  stderr: string;
  exit_code: number;
}

interface Box {
  spec: SandboxSpec;
  handle: SandboxHandle;
  asUser(cmd: string, env?: Record<string, string>): Promise<Exec>;
  asRoot(cmd: string, env?: Record<string, string>): Promise<Exec>;
}

/** `/etc` and `/usr/bin` of an image's file system: each entry's kind, owner, mode and content. */
function imageDigest(rootfs: string): string {
  const hash = createHash('sha256');
  const walk = (dir: string) => {
    for (const name of readdirSync(dir).sort()) {
      const path = join(dir, name);
      const stat = lstatSync(path);
      hash.update(`${path} ${stat.mode} ${stat.uid} ${stat.gid} ${stat.size}\n`);
      if (stat.isDirectory()) walk(path);
      else if (stat.isFile()) hash.update(readFileSync(path));
      else if (stat.isSymbolicLink()) hash.update(readlinkSync(path));
    }
  };
  walk(join(rootfs, 'etc'));
  walk(join(rootfs, 'usr', 'bin'));
  return hash.digest('hex');
}

/** A sandbox's network namespace seen from the host: links, addresses, routes, nft rules. */
function netState(pid: number): string {
  const inNs = (...argv: string[]) =>
    execFileSync('nsenter', [`--net=/proc/${pid}/ns/net`, ...argv], { encoding: 'utf8' });
  return (
    [
      inNs('ip', '-o', 'link'),
      inNs('ip', '-o', 'addr'),
      inNs('ip', 'route'),
      // Terse: without the sets' elements, which egress fills as the sandbox resolves names.
      inNs('nft', '-t', 'list', 'ruleset'),
    ]
      .join('\n')
      // IPv6 duplicate address detection ends on its own a moment after the start.
      .replace(/ tentative\b/g, '')
  );
}

/** Capability masks and no_new_privs of every process of the sandbox whose first is `pid`. */
function processCaps(
  pid: number,
): { pid: number; uid: number; bnd: bigint; eff: bigint; nnp: string }[] {
  const pids = [pid];
  const seen = [];
  while (pids.length > 0) {
    const next = pids.pop() as number;
    let status: string;
    try {
      status = readFileSync(`/proc/${next}/status`, 'utf8');
    } catch {
      continue;
    }
    const field = (name: string) => new RegExp(`^${name}:\\s+(\\S+)`, 'm').exec(status)?.[1] ?? '';
    seen.push({
      pid: next,
      uid: Number(field('Uid')),
      bnd: BigInt(`0x${field('CapBnd')}`),
      eff: BigInt(`0x${field('CapEff')}`),
      nnp: field('NoNewPrivs'),
    });
    try {
      for (const task of readdirSync(`/proc/${next}/task`)) {
        const children = readFileSync(`/proc/${next}/task/${task}/children`, 'utf8');
        pids.push(...children.split(/\s+/).filter(Boolean).map(Number));
      }
    } catch {
      // it ended meanwhile
    }
  }
  return seen;
}

/** What each probe of root-escape.py must answer (a new probe must be listed here). */
const EXPECTED: Record<string, RegExp> = {
  // The network: CAP_NET_ADMIN and CAP_NET_RAW are not root's.
  'ip-link-set': /^refused:EPERM$/,
  'ip-addr-add': /^refused:EPERM$/,
  'ip-route-add': /^refused:EPERM$/,
  'ip-route-del-default': /^refused:EPERM$/,
  'ioctl-ifflags': /^refused:EPERM$/,
  'nft-list-ruleset': /^refused:EPERM$/,
  'nft-flush-ruleset': /^refused:EPERM$/,
  'raw-socket-inet': /^refused:EPERM$/,
  'raw-socket-packet': /^refused:EPERM$/,
  // The image has neither nft nor ip; were they there, the calls above are what they make.
  'tool-nft': /^refused:/,
  'tool-ip': /^refused:/,
  // The host's files, processes and sockets are not in the sandbox's namespaces at all.
  'host-marker': /^refused:ENOENT$/,
  'host-marker-via-proc1': /^refused:ENOENT$/,
  'host-dir': /^refused:ENOENT$/,
  'host-process-visible': /^refused:not-found/,
  'host-pid-cwd': /^refused:(ENOENT|EACCES|not-found)/,
  'host-unix-socket': /^refused:ENOENT$/,
  'host-abstract-socket': /^refused:ECONNREFUSED$/,
  'sys-uevent-helper': /^refused:(ENOENT|EROFS|EACCES|EPERM)$/,
  'sys-cgroup-release-agent': /^refused:(ENOENT|EROFS|EACCES|EPERM)$/,
  'sys-cgroup-procs': /^refused:(ENOENT|EROFS|EACCES|EPERM)$/,
  'sysctl-core-pattern': /^refused:(EROFS|EACCES|EPERM)$/,
  'sysctl-modprobe': /^refused:(ENOENT|EROFS|EACCES|EPERM)$/,
  'sysctl-hostname': /^refused:(EROFS|EACCES|EPERM)$/,
  'sysctl-ip-forward': /^refused:(EROFS|EACCES|EPERM)$/,
  'sysctl-max-userns': /^refused:(EROFS|EACCES|EPERM)$/,
  'sysctl-drop-caches': /^refused:(EROFS|EACCES|EPERM)$/,
  'sysrq-trigger': /^refused:(ENOENT|EROFS|EACCES|EPERM)$/,
  'tool-sysctl': /^refused:/,
  'proc-kcore': /^refused:(ENOENT|EACCES|EPERM)$/,
  'dev-kmsg': /^refused:(ENOENT|EACCES|EPERM)$/,
  'dmesg-syslog': /^refused:EPERM$/,
  'tool-dmesg': /^refused:.*Operation not permitted/,
  // What every sandbox shares, bound read-only from the host.
  'write-sudo-shim': /^refused:(EROFS|EACCES)$/,
  'chmod-sudo-shim': /^refused:EROFS$/,
  'write-runtime': /^refused:(EROFS|EACCES)$/,
  'create-in-runtime': /^refused:EROFS$/,
  'chown-runtime': /^refused:EROFS$/,
  // Mounts, namespaces, the kernel: no CAP_SYS_ADMIN, SYS_MODULE, SYS_PTRACE..., and seccomp.
  'mount-tmpfs': /^refused:EPERM$/,
  'mount-proc': /^refused:EPERM$/,
  'mount-cgroup': /^refused:EPERM$/,
  'remount-home-suid': /^refused:EPERM$/,
  'umount-sudo': /^refused:EPERM$/,
  'pivot-root': /^refused:EPERM$/,
  chroot: /^refused:EPERM$/,
  'unshare-user': /^refused:EPERM$/,
  'unshare-mnt': /^refused:EPERM$/,
  'unshare-net': /^refused:EPERM$/,
  'unshare-pid': /^refused:EPERM$/,
  'unshare-uts': /^refused:EPERM$/,
  'unshare-ipc': /^refused:EPERM$/,
  'unshare-cgroup': /^refused:EPERM$/,
  'tool-unshare-user': /^refused:.*Operation not permitted/,
  'tool-unshare-mount': /^refused:.*Operation not permitted/,
  'tool-unshare-net': /^refused:.*Operation not permitted/,
  'tool-nsenter': /^refused:.*Operation not permitted/,
  'setns-proc-ns': /^refused:not-found no setns succeeded$/,
  'init-module': /^refused:EPERM$/,
  'finit-module': /^refused:EPERM$/,
  'delete-module': /^refused:EPERM$/,
  'tool-modprobe': /^refused:/,
  'kexec-load': /^refused:EPERM$/,
  'add-key': /^refused:EPERM$/,
  keyctl: /^refused:EPERM$/,
  'bpf-map': /^refused:EPERM$/,
  'perf-event-open': /^refused:(EPERM|EACCES)$/,
  'ptrace-host-pid': /^refused:(ESRCH|not-found)/,
  'ptrace-default-user': /^refused:EPERM$/,
  'mknod-char': /^refused:EPERM$/,
  'mknod-block': /^refused:EPERM$/,
  'open-by-handle': /^refused:EPERM$/,
  'ambient-sys-admin': /^refused:EPERM$/,
  setfcap: /^refused:EPERM$/,
  // Only 0 and 1000 are mapped: no other host uid to become.
  'setuid-unmapped': /^refused:EINVAL$/,
  'clock-settime': /^refused:EPERM$/,
  reboot: /^refused:EPERM$/,
  sethostname: /^refused:EPERM$/,
  ...(process.arch === 'x64' ? { ioperm: /^refused:EPERM$/ } : {}),
};

/** The probes whose answer is not what EXPECTED says (none: every way out was refused). */
function unexpected(results: Record<string, string>): string[] {
  const names = new Set([...Object.keys(EXPECTED), ...Object.keys(results)]);
  return [...names]
    .filter((name) => !EXPECTED[name]?.test(results[name] ?? '(no answer)'))
    .map((name) => `${name}: ${results[name] ?? '(no answer)'}`);
}

/** Host sysctls and files a root that got out would change first. */
const HOST_WATCH = [
  '/proc/sys/kernel/core_pattern',
  '/proc/sys/kernel/modprobe',
  '/proc/sys/kernel/hostname',
  '/proc/sys/kernel/domainname',
  '/proc/sys/net/ipv4/ip_forward',
  '/proc/sys/user/max_user_namespaces',
  '/etc/passwd',
];
const hostState = () =>
  HOST_WATCH.map((file) => `${file}=${existsSync(file) ? readFileSync(file, 'utf8') : '-'}`).join(
    '',
  );

/** As the sandbox's root: what it does to its home, /tmp and the volume, and to the image. */
const ROOT_CHANGES = `
cd /home/user
mkdir rootdir && echo r > rootdir/f && chown -R 0:0 rootdir && chmod 0700 rootdir
cp /bin/bash suid-sh && chown 0:0 suid-sh && chmod 6755 suid-sh
cp "$(readlink -f /usr/bin/python3)" /tmp/suid-py && chown 0:0 /tmp/suid-py && chmod 6755 /tmp/suid-py
chown 0:0 /home/user/by-user && chmod 4777 /home/user/by-user
chown 0:0 /mnt/vol/by-user 2>/dev/null && echo vol-chown-root=done || echo vol-chown-root=refused
(echo r > /mnt/vol/by-root) 2>/dev/null && echo vol-create-root=done || echo vol-create-root=refused
chmod 6755 /mnt/vol/suid-sh && echo vol-chmod=done
chown 1000:1000 /mnt/vol/suid-sh && echo vol-chown-user=done
echo 'evil:x:0:0::/root:/bin/sh' >> /etc/passwd && echo passwd=written
echo 'evil' > /usr/bin/env && echo env=written
printf '#!/bin/sh\\necho evil\\n' > /usr/bin/abx-evil && chmod 4755 /usr/bin/abx-evil && echo new=written
rm /usr/bin/yes && echo yes=removed
chmod 666 /etc/shadow 2>/dev/null && echo shadow=opened || echo shadow=refused
echo "$SECRET" > /root/a-secret && echo "$SECRET" > /run/abx/a-secret && echo secret=written
`;

/** As the default user, after ROOT_CHANGES: what the set-id files root left give it. */
const USER_AFTER = `
echo "sh=$(/home/user/suid-sh -p -c 'echo $(id -u) $(id -g) $(sed -n "s/^CapEff:\\t//p" /proc/self/status)')"
echo "py=$(/tmp/suid-py -c 'import os; print(os.geteuid(), os.getegid())')"
echo "vol=$(/mnt/vol/suid-sh -p -c 'id -u')"
cat /home/user/rootdir/f >/dev/null 2>&1 && echo rootdir=read || echo rootdir=refused
echo "nnp=$(sed -n 's/^NoNewPrivs:\\t//p' /proc/self/status)"
`;

/** From the neighbour, as its root: every sudo socket it can reach, asked for A's secret. */
const NEIGHBOUR_SUDO = `
import glob, json, os, socket, struct, sys
pids = [p for p in os.listdir('/proc') if p.isdigit()]
paths = set(['/run/abx/sudo.sock', '/proc/%s/root/run/abx/sudo.sock' % sys.argv[1]])
paths.update('/proc/%s/root/run/abx/sudo.sock' % p for p in pids)
paths.update(glob.glob('/run/**/*.sock', recursive=True) + glob.glob('/tmp/**/*.sock', recursive=True))
answers = {}
for path in sorted(paths):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(path)
    except OSError:
        answers[path] = 'unreachable'
        continue
    header = json.dumps({'argv': ['sh', '-c', 'cat /root/a-secret /run/abx/a-secret; id -u'], 'cwd': '/', 'env': {}}).encode()
    s.sendall(struct.pack('>BI', 0x48, len(header)) + header + struct.pack('>BI', 0x45, 0))
    data = b''
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass  # not a sudo socket that ends its answers: what came is what it said
    out = b''
    while len(data) >= 5:
        kind, length = struct.unpack('>BI', data[:5])
        if kind == 0x4f:
            out += data[5:5 + length]
        data = data[5 + length:]
    answers[path] = out.decode()
print(json.dumps(answers))
`;

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`root escape attempts: skipped, ${engine.reason}`, () => {
    test('root escape', () => undefined);
  });
} else {
  const docker = engine.docker;
  describe('root inside a root-allowing image sandbox tries to get out', () => {
    let folder: string;
    let provider: LocalProvider;
    let egress: EgressController | undefined;
    let internet: TestInternet | undefined;
    let volume: VolumeSpec | undefined;
    let rootfs: string;
    let imageBefore: string;
    let netBefore: string;
    let hostBefore: string;
    const boxes: Box[] = [];
    let a: Box;
    let b: Box;
    const servers: Server[] = [];
    const hostHits: string[] = [];
    const secret = randomBytes(8).toString('hex');
    let host: {
      marker: string;
      hostPid: number;
      hostCwd: string;
      hostDir: string;
      hostSocket: string;
      abstract: string;
    };
    /** Root's attacks through root's envd and through `sudo`, and the denied checks around them. */
    let viaEnvd: Record<string, string>;
    let viaSudo: Record<string, string>;
    let deniedBefore: Exec | undefined;
    let deniedAfter: Exec | undefined;
    let hitsBefore = 0;

    const start = async (name: string, extra: Partial<SandboxSpec>): Promise<Box> => {
      const id = `rootesc-${name}-${randomBytes(3).toString('hex')}`;
      const spec: SandboxSpec = {
        id,
        accessToken: randomBytes(24).toString('hex'),
        dir: join(folder, id),
        env: {},
        workdir: '/home/user',
        resources: { processes: 256 },
        network: 'none',
        image: DEBIAN_IMAGE,
        allowRoot: true,
        ...extra,
      };
      const handle = await provider.create(spec);
      const run = async (socket: string, cmd: string, env?: Record<string, string>) => {
        const answer = await envdRequest<Exec>(
          socket,
          spec.accessToken,
          'POST',
          '/process/exec',
          { cmd, timeout: EXEC_TIMEOUT_S, ...(env ? { env } : {}) },
          (EXEC_TIMEOUT_S + 5) * 1000,
        );
        if (answer.status !== 200) throw new Error(`exec ${cmd}: ${JSON.stringify(answer.body)}`);
        return answer.body;
      };
      const box: Box = {
        spec,
        handle,
        asUser: (cmd, env) => run(box.handle.envdSocket, cmd, env),
        asRoot: (cmd, env) => run(box.handle.envdRootSocket as string, cmd, env),
      };
      boxes.push(box);
      return box;
    };

    /** Runs the attack table as root (root's envd or `sudo`); probe → result. */
    const attack = async (box: Box, via: 'envd' | 'sudo'): Promise<Record<string, string>> => {
      const cmd = `${via === 'sudo' ? 'sudo ' : ''}python3 -c "$CODE" "$HOST"`;
      const run = via === 'sudo' ? box.asUser : box.asRoot;
      const done = await run(cmd, { CODE: ATTACKS, HOST: JSON.stringify(host) });
      if (done.exit_code !== 0) throw new Error(`the attacks failed: ${done.stderr}`);
      return JSON.parse(done.stdout) as Record<string, string>;
    };

    /** A direct connection to the denied address, and a request for it through egress. */
    const deniedCheck = () =>
      (a as Box).asUser(`python3 - <<'EOF'
import socket, urllib.request
try:
    socket.create_connection(('${internet?.addresses.denied}', 7000), timeout=3); print('direct=open')
except OSError: print('direct=refused')
try:
    urllib.request.urlopen('http://denied.test/', timeout=5); print('proxy=open')
except Exception as e: print('proxy=%s' % getattr(e, 'code', type(e).__name__))
EOF`);

    beforeAll(async () => {
      await ensureDebianImage(docker);
      folder = mkdtempSync('/var/tmp/abx-root-escape-');
      host = {
        marker: join(folder, 'host-marker'),
        hostPid: process.pid,
        hostCwd: process.cwd(),
        hostDir: folder,
        hostSocket: join(folder, 'host.sock'),
        abstract: `abx-root-escape-${randomBytes(4).toString('hex')}`,
      };
      writeFileSync(host.marker, 'host secret\n');
      for (const address of [host.hostSocket, `\0${host.abstract}`]) {
        const server = createServer((socket) => {
          hostHits.push(address);
          socket.destroy();
        });
        await new Promise<void>((resolve) => server.listen(address, resolve));
        servers.push(server);
      }
      if (!internetUnavailable()) {
        internet = await makeInternet();
        egress = new EgressController({ netns: internet.path, hostsFile: internet.hostsFile });
      }
      provider = new LocalProvider({
        runtimeDir: join(ROOT, 'dist', 'runtime'),
        ...(egress ? { egress } : {}),
      });
      rootfs = await imageRootfs(docker, DEBIAN_IMAGE);
      imageBefore = imageDigest(rootfs);
      hostBefore = hostState();
      volume = {
        id: `vol_${randomBytes(6).toString('hex')}`,
        name: 'root-escape',
        sizeBytes: 32 * 1024 * 1024,
        dir: join(folder, 'volume'),
      };
      await provider.volumes.create(volume);
      [a, b] = await Promise.all([
        start('a', {
          network: internet ? 'internet' : 'none',
          ...(internet ? { egress: { allowOut: [], denyOut: [internet.addresses.denied] } } : {}),
          volumeMounts: [{ volume, path: '/mnt/vol', readOnly: false }],
        }),
        start('b', {}),
      ]);
      netBefore = netState(a.handle.pid);
      hitsBefore = internet?.hits().length ?? 0;
      if (internet) deniedBefore = await deniedCheck();
      viaEnvd = await attack(a, 'envd');
      viaSudo = await attack(a, 'sudo');
      if (internet) deniedAfter = await deniedCheck();
    }, 300_000);

    afterAll(async () => {
      for (const box of boxes) await provider.kill(box.handle).catch(() => undefined);
      if (volume) await provider?.volumes.remove(volume).catch(() => undefined);
      await provider?.close();
      egress?.close();
      internet?.remove();
      for (const server of servers) server.close();
      if (folder) rmSync(folder, { recursive: true, force: true });
    });

    test('every way out is refused, to root through its envd and through sudo alike', () => {
      expect(unexpected(viaEnvd)).toEqual([]);
      expect(unexpected(viaSudo)).toEqual([]);
    });

    test("the network: the sandbox's links, addresses, routes and nftables rules are as they were; a denied destination stays denied", () => {
      expect(netState(a.handle.pid)).toBe(netBefore);
      if (!internet) return;
      expect(deniedBefore?.stdout).toBe('direct=refused\nproxy=403\n');
      expect(deniedAfter?.stdout).toBe(deniedBefore?.stdout);
      const hits = internet.hits().slice(hitsBefore).join('\n');
      expect(hits).not.toContain(internet.addresses.denied);
      expect(hits).not.toContain('denied.test');
    });

    test('the host: its sockets were never reached, its sysctls and files are unchanged; every process of the sandboxes keeps to 9 capabilities and no_new_privs', () => {
      expect(hostHits).toEqual([]);
      expect(hostState()).toBe(hostBefore);
      expect(readFileSync(host.marker, 'utf8')).toBe('host secret\n');
      for (const box of [a, b]) {
        const processes = processCaps(box.handle.pid);
        // bwrap, root's init, both envds, and whatever runs.
        expect(processes.length).toBeGreaterThanOrEqual(4);
        for (const p of processes) {
          expect(p.bnd & ~ROOT_CAP_MASK, `pid ${p.pid} CapBnd`).toBe(0n);
          expect(p.eff & ~ROOT_CAP_MASK, `pid ${p.pid} CapEff`).toBe(0n);
          expect(p.nnp, `pid ${p.pid} NoNewPrivs`).toBe('1');
        }
        const uids = new Set(processes.map((p) => p.uid));
        expect([...uids].sort()).toEqual(
          [box.handle.uid as number, rootUidOf(box.handle.uid as number)].sort(),
        );
      }
    });

    test("the daemon's way in: links root leaves in /run/abx (its own, sticky) lead to no host socket", async () => {
      const made = await a.asRoot(
        `ln -s ${host.hostSocket} /run/abx/escape.sock && ln -s ${host.hostSocket} /run/abx/ports/escape.sock && ln -s ${host.hostDir} /run/abx/escape-dir && echo linked`,
      );
      expect(made.stdout).toBe('linked\n');
      const inA = `/proc/${a.handle.pid}/root/run/abx`;
      // An absolute link under /proc/PID/root resolves on the host: a plain connect() would
      // reach the host's socket. The daemon's connect opens each part without following links.
      expect(statSync(`${inA}/escape.sock`).isSocket()).toBe(true);
      const tries = await Promise.all(
        ['escape.sock', 'ports/escape.sock', 'escape-dir/host.sock'].map(
          (path) =>
            new Promise<string>((resolve) => {
              const socket = connectSandboxSocket(`${inA}/${path}`);
              socket.once('connect', () => {
                socket.destroy();
                resolve(`${path}: connected`);
              });
              socket.once('error', (error: NodeJS.ErrnoException) =>
                resolve(`${path}: ${error.code}`),
              );
            }),
        ),
      );
      expect(tries).toEqual([
        'escape.sock: ENOTSOCK',
        'ports/escape.sock: ENOTSOCK',
        'escape-dir/host.sock: ENOTDIR',
      ]);
      await new Promise((r) => setTimeout(r, 100));
      expect(hostHits).toEqual([]);
    });

    test("files: what root chowns lands as the sandbox's root uid (never host root, never another sandbox's uid); its set-id files give the default user nothing", async () => {
      await a.asUser(
        'echo u > /home/user/by-user && echo u > /home/user/user-file && echo u > /mnt/vol/by-user && cp /bin/bash /mnt/vol/suid-sh',
      );
      const changes = await a.asRoot(ROOT_CHANGES, { SECRET: secret });
      // Root has no host uid on the volume's idmapped mount (it maps the sandbox's uid only): it
      // can neither give a volume file to itself nor make one; it may change modes and give files
      // to the default user.
      expect(changes.stdout).toBe(
        'vol-chown-root=refused\nvol-create-root=refused\nvol-chmod=done\nvol-chown-user=done\npasswd=written\nenv=written\nnew=written\nyes=removed\nshadow=refused\nsecret=written\n',
      );
      const user = await a.asUser(USER_AFTER);
      expect(user.stdout).toBe(
        'sh=1000 1000 0000000000000000\npy=1000 1000\nvol=1000\nrootdir=refused\nnnp=1\n',
      );
      // On the host: the home and /tmp (the sandbox's disk, through its root) hold the sandbox's
      // two uids only; what root made set-id is the root uid's, an unprivileged uid outside.
      const uid = a.handle.uid as number;
      const rootUid = rootUidOf(uid);
      const inA = (path: string) => `/proc/${a.handle.pid}/root${path}`;
      const suid = statSync(inA('/home/user/suid-sh'));
      expect([suid.uid, suid.gid, suid.mode & 0o7000]).toEqual([rootUid, rootUid, 0o6000]);
      expect(statSync(inA('/tmp/suid-py')).uid).toBe(rootUid);
      expect(statSync(inA('/home/user/rootdir/f')).uid).toBe(rootUid);
      expect(statSync(inA('/home/user/by-user')).uid).toBe(rootUid);
      const owners = new Set<number>();
      const walk = (dir: string) => {
        for (const name of readdirSync(dir)) {
          const stat = lstatSync(join(dir, name));
          owners.add(stat.uid).add(stat.gid);
          if (stat.isDirectory()) walk(join(dir, name));
        }
      };
      walk(inA('/home/user'));
      walk(inA('/tmp'));
      expect([...owners].sort()).toEqual([uid, rootUid].sort());
      // The volume on the host (its disk, mounted nosuid): its one owner uid, whatever root did.
      const mnt = await provider.volumes.mounted(volume as VolumeSpec);
      const volumeOwners = readdirSync(mnt).map((name) => statSync(join(mnt, name)).uid);
      expect(new Set(volumeOwners)).toEqual(new Set([statSync(mnt).uid]));
      expect(statSync(mnt).uid).not.toBe(0);
      expect(statSync(mnt).uid).not.toBe(rootUid);
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).toMatch(
        new RegExp(`${mnt.replaceAll('/', '\\/')} .*nosuid`),
      );
    });

    test("the image: root's writes to /etc and /usr/bin land in its upper layer; the image's files are unchanged and another sandbox of it sees none of them", async () => {
      // ROOT_CHANGES (previous test) wrote them; run again when this test runs alone.
      if (!existsSync(`/proc/${a.handle.pid}/root/usr/bin/abx-evil`)) {
        await a.asRoot(ROOT_CHANGES, { SECRET: secret });
      }
      const inA = await a.asUser(
        'grep -c "^evil:" /etc/passwd; cat /usr/bin/env; /usr/bin/abx-evil; test -e /usr/bin/yes || echo no-yes; stat -c %a /etc/shadow',
      );
      // /etc/shadow (group shadow, a gid the idmapped image does not map) cannot be copied up:
      // root may not change it (a limit, not a hole: it stays as the image has it).
      expect(inA.stdout).toBe('1\nevil\nevil\nno-yes\n640\n');
      const rootUid = rootUidOf(a.handle.uid as number);
      expect(statSync(`/proc/${a.handle.pid}/root/etc/passwd`).uid).toBe(rootUid);
      expect(statSync(`/proc/${a.handle.pid}/root/usr/bin/abx-evil`).uid).toBe(rootUid);
      expect(imageDigest(rootfs)).toBe(imageBefore);
      const inB = await b.asUser(
        'grep -c "^evil:" /etc/passwd; test -e /usr/bin/abx-evil && echo evil; /usr/bin/env true && echo env-ok; test -e /usr/bin/yes && echo yes; stat -c %a /etc/shadow; true',
      );
      expect(inB.stdout).toBe('0\nenv-ok\nyes\n640\n');
    });

    test("sudo reaches root in its own sandbox only: the neighbour's root finds no socket that runs commands in this one; sudo -u anyone else is refused", async () => {
      if (!existsSync(`/proc/${a.handle.pid}/root/root/a-secret`)) {
        await a.asRoot(ROOT_CHANGES, { SECRET: secret });
      }
      const others = await a.asUser(
        'for u in nobody "#1001" daemon; do sudo -u "$u" id -u; echo "u=$?"; done; sudo --user=nobody id; echo "user=$?"',
      );
      expect(others.stdout).toBe('u=1\nu=1\nu=1\nuser=1\n');
      expect(others.stderr).toMatch(/runs commands as root only/);
      const fromB = await b.asUser(`sudo python3 -c "$CODE" ${a.handle.pid}`, {
        CODE: NEIGHBOUR_SUDO,
      });
      expect(fromB.exit_code).toBe(0);
      const answers = JSON.parse(fromB.stdout) as Record<string, string>;
      // B's own sudo socket answers, as B's root; none holds A's secret.
      expect(answers['/run/abx/sudo.sock']).toBe('0\n');
      expect(JSON.stringify(answers)).not.toContain(secret);
      expect(answers[`/proc/${a.handle.pid}/root/run/abx/sudo.sock`]).toBe('unreachable');
    });

    test("a hostile image's links where sudo is bound lead nowhere: the sandbox starts with abx's sudo and the host gains no file", async () => {
      // bwrap binds sudo at /usr/bin/sudo, and follows a link there even to /oldroot/..., its view
      // of the host's root while it sets up (found by this test: bwrap made the host file).
      const tag = `abx-test/root-escape-sudo-link:${randomBytes(4).toString('hex')}`;
      const linkedUsr = `${tag}-usr`;
      const noUsr = `${tag}-nousr`;
      const target = `/tmp/abx-root-escape-${randomBytes(4).toString('hex')}`;
      const rootfsDir = join(folder, 'hostile-rootfs');
      busyboxRoot(rootfsDir);
      mkdirSync(join(rootfsDir, 'usr', 'bin'), { recursive: true });
      symlinkSync(`/oldroot${target}`, join(rootfsDir, 'usr', 'bin', 'sudo'));
      await importFolder(docker, rootfsDir, tag);
      let box: Box | undefined;
      try {
        box = await start('hostile', { image: tag });
        expect(existsSync(target)).toBe(false);
        const inside = await box.asUser('id -u; sudo id -u');
        expect(inside.stdout).toBe('1000\n0\n');
        // And on its kept disk after a hibernate: the image's link is still under it.
        await provider.hibernate(box.handle, box.spec);
        box.handle = await provider.wake(box.handle, box.spec);
        expect((await box.asUser('sudo id -u')).stdout).toBe('0\n');
        expect(existsSync(target)).toBe(false);
        // A link on the way to /usr/bin is refused, naming it (the launcher cannot undo that one).
        rmSync(join(rootfsDir, 'usr', 'bin'), { recursive: true });
        symlinkSync('/oldroot/tmp', join(rootfsDir, 'usr', 'bin'));
        await importFolder(docker, rootfsDir, linkedUsr);
        await expect(start('hostile-usr', { image: linkedUsr })).rejects.toThrow(
          /\/usr\/bin is a symbolic link, and the local provider makes \/usr\/bin there as root/,
        );
        // No /usr/bin at all: refused, saying where sudo goes (bwrap could not make it there).
        rmSync(join(rootfsDir, 'usr'), { recursive: true });
        await importFolder(docker, rootfsDir, noUsr);
        await expect(start('hostile-nousr', { image: noUsr })).rejects.toThrow(
          /has no \/usr\/bin, where a sandbox that allows root gets sudo/,
        );
      } finally {
        if (box) await provider.kill(box.handle).catch(() => undefined);
        rmSync(target, { force: true });
        for (const image of [tag, linkedUsr, noUsr]) {
          await docker
            .getImage(image)
            .remove({ force: true })
            .catch(() => undefined);
        }
        await provider.pruneImages();
      }
    });

    test('a rootless provider refuses allowRoot, saying why, before it starts anything', async () => {
      // Run where the refusal is decided: a LocalProvider as an unprivileged uid (rootless mode,
      // its default there), bundled for a plain node.
      const uid = rootlessUid();
      const dir = join(folder, 'rootless');
      mkdirSync(dir, { mode: 0o755 });
      chmodSync(folder, 0o711);
      writeFileSync(
        join(dir, 'entry.ts'),
        `import { LocalProvider } from ${JSON.stringify(join(ROOT, 'src', 'providers', 'local', 'local-provider.ts'))};
const provider = new LocalProvider({ runtimeDir: ${JSON.stringify(join(ROOT, 'dist', 'runtime'))} });
provider
  .create(JSON.parse(process.argv[2]))
  .then(() => console.log('started'), (error) => console.log(\`refused (\${provider.mode}): \${error.message}\`))
  .finally(() => provider.close());
`,
      );
      buildSync({
        entryPoints: [join(dir, 'entry.ts')],
        outfile: join(dir, 'entry.cjs'),
        bundle: true,
        platform: 'node',
        format: 'cjs',
        logLevel: 'error',
      });
      const spec = { ...a.spec, id: 'rootless-root', dir: join(dir, 'sandbox') };
      const [setpriv, ...asUid] = asHostUid(uid);
      const out = execFileSync(
        setpriv,
        [...asUid, process.execPath, join(dir, 'entry.cjs'), JSON.stringify(spec)],
        { encoding: 'utf8', env: { PATH: process.env.PATH, HOME: dir }, timeout: 30_000 },
      );
      // Refused before anything is made, saying why and what to do.
      expect(out).toMatch(
        /^refused \(rootless\): sandbox rootless-root allows root, which a rootless daemon cannot give: .*\(run the daemon as root\)/,
      );
      expect(existsSync(spec.dir)).toBe(false);
    });
  });
}
