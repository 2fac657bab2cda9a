import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
} from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { DEFAULT_DISK_BYTES } from '../commands/template-runtime.js';
import { egressOptionsFromEnv, egressProblem } from '../egress/controller.js';
import { startSandboxNet, stopSandboxNet } from '../egress/sandbox-net.js';
import { findDaemon } from '../installation/daemon-connection.js';
import { dockerClient, engineAddress, probeEngine } from '../providers/docker/engine.js';
import { cgroupParent, cgroupSupport, cgroupVersion } from '../providers/local/cgroups.js';
import { createDiskImage } from '../providers/local/sandbox-disk.js';
import {
  localRuntimeCache,
  type NoImageNode,
  noImageNode,
} from '../providers/local/sandbox-node.js';
import { SandboxUids, UID_LOCK_DIR, uidRangeFromEnv } from '../providers/local/sandbox-uids.js';
import { compileSeccompFilter } from '../providers/local/seccomp.js';
import { type PortableRuntime, portableRuntime } from '../providers/portable-runtime.js';
import { packageInfo } from '../util/package-info.js';
import {
  DAEMON_PATH,
  dockerGroupFix,
  findProgram,
  type ProbeResult,
  probe,
  probeFailure,
  SANDBOX_PATH,
} from './doctor-probe.js';
import { type Check, type DoctorReport, reportOf } from './doctor-report.js';

/** How long each kind of probe may take; a probe past its time is killed and reported. */
const TIMEOUT = {
  version: 5_000,
  sandbox: 15_000,
  disk: 30_000,
  engine: 5_000,
  python: 30_000,
  chromium: 20_000,
};

/** The oldest bubblewrap with what the provider passes (`--disable-userns`, `--size`). */
const BWRAP_MINIMUM = [0, 8, 0];

/** Where the BROWSER group of the command server looks for Chromium (runtime/server/server.ts). */
const CHROMIUM = '/usr/bin/chromium';

/** When each Node line stops getting security fixes (nodejs.org/en/about/previous-releases). */
const NODE_END_OF_LIFE: Record<number, string> = {
  18: '2025-04-30',
  20: '2026-04-30',
  22: '2027-04-30',
  23: '2025-06-01',
  24: '2028-04-30',
  25: '2026-06-01',
  26: '2029-04-30',
};

function readTrimmed(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** The sysctls that forbid unprivileged user namespaces here, each with the setting that allows them. */
function userNamespaceFix(): string {
  const fixes: string[] = [];
  if (readTrimmed('/proc/sys/kernel/unprivileged_userns_clone') === '0') {
    fixes.push('sysctl -w kernel.unprivileged_userns_clone=1');
  }
  if (readTrimmed('/proc/sys/user/max_user_namespaces') === '0') {
    fixes.push('sysctl -w user.max_user_namespaces=15000');
  }
  if (readTrimmed('/proc/sys/kernel/apparmor_restrict_unprivileged_userns') === '1') {
    fixes.push(
      'sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile that allows userns for /usr/bin/bwrap)',
    );
  }
  if (fixes.length > 0) return `${fixes.join('; ')}; keep it in /etc/sysctl.d/`;
  return 'allow unprivileged user namespaces (sysctl -w user.max_user_namespaces=15000, and kernel.unprivileged_userns_clone=1 where the kernel has it); inside a container, run it with a seccomp profile that allows unshare/clone of user namespaces';
}

function versionAtLeast(text: string, minimum: number[]): boolean {
  const parts = text.split('.').map(Number);
  for (let i = 0; i < minimum.length; i++) {
    const have = parts[i] ?? 0;
    const want = minimum[i] ?? 0;
    if (have !== want) return have > want;
  }
  return true;
}

/** `setpriv` to the sandbox's uid in root mode: probes run as the sandboxes will. */
function asSandbox(uid: number | undefined, command: string[]): [string, string[]] {
  const argv =
    uid === undefined
      ? command
      : [
          'setpriv',
          `--reuid=${uid}`,
          `--regid=${uid}`,
          '--clear-groups',
          '--no-new-privs',
          ...command,
        ];
  return [argv[0] as string, argv.slice(1)];
}

async function bubblewrap(): Promise<{ check: Check; path?: string }> {
  const path = findProgram('bwrap', DAEMON_PATH);
  if (!path) {
    return {
      check: {
        name: 'bubblewrap',
        status: 'missing',
        required: true,
        found: `no bwrap in ${DAEMON_PATH} (where the daemon looks for it)`,
        fix: 'apt-get install bubblewrap (Fedora: dnf install bubblewrap)',
      },
    };
  }
  const result = await probe(path, ['--version'], { timeoutMs: TIMEOUT.version });
  const version = /bubblewrap (\d+(?:\.\d+)*)/.exec(result.stdout)?.[1];
  if (!result.ok || !version) {
    return {
      check: {
        name: 'bubblewrap',
        status: 'failed',
        required: true,
        found: probeFailure(result, `${path} --version`, TIMEOUT.version),
        fix: 'reinstall it: apt-get install --reinstall bubblewrap',
      },
    };
  }
  if (!versionAtLeast(version, BWRAP_MINIMUM)) {
    return {
      check: {
        name: 'bubblewrap',
        status: 'failed',
        required: true,
        found: `bubblewrap ${version} at ${path}; the provider needs ${BWRAP_MINIMUM.join('.')} or newer (--disable-userns)`,
        fix: 'install bubblewrap 0.8 or newer (Debian 12 and Ubuntu 24.04 have it; older releases: backports)',
      },
      path,
    };
  }
  return {
    check: {
      name: 'bubblewrap',
      status: 'ok',
      required: true,
      found: `bubblewrap ${version} at ${path}`,
    },
    path,
  };
}

/** Really makes a user namespace, as the uid the sandboxes run as. */
async function userNamespaces(uid: number | undefined): Promise<Check> {
  const who =
    uid === undefined ? `as this user (uid ${process.getuid?.()})` : `as sandbox uid ${uid}`;
  const max = readTrimmed('/proc/sys/user/max_user_namespaces');
  const [file, args] = asSandbox(uid, ['unshare', '--user', '--', 'true']);
  const result = await probe(file, args, { timeoutMs: TIMEOUT.version });
  if (result.ok) {
    return {
      name: 'user namespaces',
      status: 'ok',
      required: true,
      found: `made one ${who}${max ? ` (user.max_user_namespaces ${max})` : ''}`,
    };
  }
  if (result.spawnError === 'ENOENT') {
    return {
      name: 'user namespaces',
      status: 'missing',
      required: true,
      found: `${file} is not installed, so no user namespace could be tried`,
      fix: 'apt-get install util-linux (setpriv, unshare)',
    };
  }
  return {
    name: 'user namespaces',
    status: 'failed',
    required: true,
    found: `none could be made ${who}: ${probeFailure(result, 'unshare --user', TIMEOUT.version)}`,
    fix: userNamespaceFix(),
  };
}

/**
 * Starts a real, tiny sandbox the way the provider does: as the sandbox's uid, with user, pid,
 * ipc, uts, net and cgroup namespaces, no nested user namespaces and the provider's seccomp filter.
 */
async function sandboxStart(bwrap: string, uid: number | undefined, dir: string): Promise<Check> {
  const filter = join(dir, 'seccomp.bpf');
  await writeFile(filter, compileSeccompFilter(), { mode: 0o644 });
  const fd = openSync(filter, 'r');
  const [file, args] = asSandbox(uid, [
    bwrap,
    '--unshare-user',
    '--uid',
    '1000',
    '--gid',
    '1000',
    '--disable-userns',
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-net',
    '--unshare-cgroup-try',
    '--new-session',
    '--die-with-parent',
    '--ro-bind',
    '/',
    '/',
    '--proc',
    '/proc',
    '--dev',
    '/dev',
    '--tmpfs',
    '/tmp',
    '--clearenv',
    '--setenv',
    'PATH',
    DAEMON_PATH,
    '--seccomp',
    '3',
    '--',
    'true',
  ]);
  let result: ProbeResult;
  try {
    result = await probe(file, args, { timeoutMs: TIMEOUT.sandbox, fds: [fd] });
  } finally {
    closeSync(fd);
  }
  const who = uid === undefined ? 'as this user' : `as sandbox uid ${uid}`;
  if (result.ok) {
    return {
      name: 'sandbox start',
      status: 'ok',
      required: true,
      found: `bwrap ran a process ${who} in new user, pid, ipc, uts and net namespaces under the seccomp filter`,
    };
  }
  const why = probeFailure(result, 'bwrap', TIMEOUT.sandbox);
  const fix = /Unknown option|unrecognized option/i.test(result.stderr)
    ? 'install bubblewrap 0.8 or newer'
    : /namespace|uid map|Operation not permitted|Permission denied/i.test(result.stderr)
      ? userNamespaceFix()
      : 'run the probe by hand to see more: bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev true';
  return { name: 'sandbox start', status: 'failed', required: true, found: `${why} (${who})`, fix };
}

/** Root mode's uid range: valid, lockable, and clear of accounts and subordinate id ranges. */
function uidRange(): { check: Check; uid?: number; release: () => void } {
  const none = () => undefined;
  let range: { first: number; count: number };
  try {
    range = uidRangeFromEnv();
  } catch (error) {
    return {
      check: {
        name: 'uid range',
        status: 'failed',
        required: true,
        found: (error as Error).message,
        fix: 'set ABX_UID_RANGE=FIRST-LAST, e.g. ABX_UID_RANGE=1500000000-1500999999, or unset it',
      },
      release: none,
    };
  }
  const last = range.first + range.count - 1;
  const text = `${range.first}-${last}${process.env.ABX_UID_RANGE ? ' (ABX_UID_RANGE)' : ' (the default; ABX_UID_RANGE sets it)'}`;
  const uids = new SandboxUids(range);
  const dir = mkdtempSync(join(tmpdir(), 'abx-doctor-uid-'));
  let uid: number;
  try {
    uid = uids.allocate('abx-doctor', dir);
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    return {
      check: {
        name: 'uid range',
        status: 'failed',
        required: true,
        found: `${text}: no uid could be locked in ${UID_LOCK_DIR}: ${(error as Error).message}`,
        fix: `the root daemon keeps a lock per sandbox uid in ${UID_LOCK_DIR}: make /run writable for root, or widen ABX_UID_RANGE`,
      },
      release: none,
    };
  }
  const release = () => {
    uids.release(uid);
    rmSync(dir, { recursive: true, force: true });
  };
  const inside = (n: number) => n >= range.first && n <= last;
  const clashes: string[] = [];
  for (const line of (readTrimmed('/etc/passwd') ?? '').split('\n')) {
    const [name, , id] = line.split(':');
    if (name && inside(Number(id))) clashes.push(`account ${name} (uid ${id})`);
  }
  for (const file of ['/etc/subuid', '/etc/subgid']) {
    for (const line of (readTrimmed(file) ?? '').split('\n')) {
      const [name, start, count] = line.split(':');
      const a = Number(start);
      const b = a + Number(count) - 1;
      if (name && Number.isFinite(b) && a <= last && b >= range.first) {
        clashes.push(`${file}: ${name} ${a}-${b}`);
      }
    }
  }
  const held = uids.held().length - 1;
  const found = `${text}; ${held} in use by sandboxes now, locks in ${UID_LOCK_DIR}`;
  if (clashes.length > 0) {
    return {
      check: {
        name: 'uid range',
        status: 'warning',
        required: true,
        found: `${found}; it overlaps ${clashes.slice(0, 3).join(', ')}`,
        fix: 'set ABX_UID_RANGE=FIRST-LAST to uids no account and no subordinate range uses',
      },
      uid,
      release,
    };
  }
  return { check: { name: 'uid range', status: 'ok', required: true, found }, uid, release };
}

/** Which cgroup controllers the daemon can write limits to (a real cgroup, made and removed). */
function cgroups(root: boolean): Check {
  const version = cgroupVersion();
  const parent = cgroupParent();
  const uid = process.getuid?.() ?? 0;
  const delegate =
    version === 2
      ? `as root: mkdir /sys/fs/cgroup/${parent} && chown -R ${uid}: /sys/fs/cgroup/${parent} && echo '+memory +pids +cpu' > /sys/fs/cgroup/cgroup.subtree_control (or start the daemon in a systemd unit with Delegate=yes and ABX_CGROUP_PARENT naming its cgroup)`
      : `as root: for c in memory pids cpu; do mkdir -p /sys/fs/cgroup/$c/${parent}; chown ${uid}: /sys/fs/cgroup/$c/${parent}{,/cgroup.procs}; done`;
  if (!version) {
    return {
      name: 'cgroups',
      status: 'warning',
      required: false,
      found:
        'no cgroup hierarchy at /sys/fs/cgroup: memory, cpu and process limits are not enforced',
      fix: 'mount cgroup2 at /sys/fs/cgroup (mount -t cgroup2 none /sys/fs/cgroup)',
    };
  }
  const support = cgroupSupport(parent);
  const usable = Object.entries(support)
    .filter(([, ok]) => ok)
    .map(([name]) => name);
  const lacking = Object.entries(support)
    .filter(([, ok]) => !ok)
    .map(([name]) => name);
  const found = `v${version}; ${usable.length > 0 ? `${usable.join(', ')} writable under ${parent}/` : 'no controller writable'}`;
  if (lacking.length === 0) return { name: 'cgroups', status: 'ok', required: false, found };
  return {
    name: 'cgroups',
    status: 'warning',
    required: false,
    found: `${found}; ${lacking.join(', ')} limits are not enforced`,
    fix: root
      ? `the kernel gives root no writable ${lacking.join(', ')} controller under /sys/fs/cgroup: mount it read-write (a container needs a writable /sys/fs/cgroup)`
      : `delegate a cgroup to this user, ${delegate}`,
  };
}

/** Root mode: a real ext4 disk image, made as the daemon makes them and loop-mounted once. */
async function diskQuotas(root: boolean, dir: string): Promise<Check> {
  if (!root) {
    return {
      name: 'disk quotas',
      status: 'warning',
      required: false,
      found:
        'rootless: a sandbox’s home and /tmp are tmpfs mounts of its disk quota each (memory-backed)',
      fix: 'run the daemon as root to give each sandbox an ext4 disk image of its own',
    };
  }
  const mkfs = findProgram('mkfs.ext4', DAEMON_PATH);
  if (!mkfs) {
    return {
      name: 'disk quotas',
      status: 'missing',
      required: true,
      found: `no mkfs.ext4 in ${DAEMON_PATH}: root mode formats a disk image per sandbox`,
      fix: 'apt-get install e2fsprogs',
    };
  }
  const image = join(dir, 'disk.img');
  try {
    await Promise.race([
      createDiskImage(image, DEFAULT_DISK_BYTES),
      new Promise((_, reject) =>
        setTimeout(
          () => reject(new Error(`did not finish within ${TIMEOUT.disk / 1000} s`)),
          TIMEOUT.disk,
        ).unref(),
      ),
    ]);
  } catch (error) {
    return {
      name: 'disk quotas',
      status: 'failed',
      required: true,
      found: `formatting an ext4 disk image failed: ${(error as Error).message}`,
      fix: 'apt-get install e2fsprogs; the daemon needs a writable /run (it keeps formatted images in /run/abx-runtime)',
    };
  }
  const mnt = join(dir, 'mnt');
  mkdirSync(mnt);
  // In a mount namespace of its own: the mount, and its loop device, go when `mount` exits.
  const result = await probe(
    'unshare',
    ['--mount', '--propagation', 'private', '--', 'mount', '-o', 'loop,nosuid,nodev', image, mnt],
    { timeoutMs: TIMEOUT.disk },
  );
  if (!result.ok) {
    return {
      name: 'disk quotas',
      status: 'failed',
      required: true,
      found: probeFailure(result, 'loop-mounting an ext4 disk image', TIMEOUT.disk),
      fix: existsSync('/dev/loop-control')
        ? 'free a loop device (losetup -D detaches unused ones) or make more: mknod /dev/loopN b 7 N'
        : 'the kernel needs loop devices: modprobe loop (in a container: --device /dev/loop-control and /dev/loopN, or --privileged)',
    };
  }
  return {
    name: 'disk quotas',
    status: 'ok',
    required: true,
    found: `an ext4 disk image per sandbox: formatted with ${mkfs} and loop-mounted`,
  };
}

/** The Node the daemon runs on: the running daemon's of this `$ABX_HOME`, else this one. */
interface DaemonNode {
  version: string;
  path: string;
  /** The running daemon's pid; absent: none runs, and `abx daemon start` would start it on this Node. */
  pid?: number;
}

async function daemonNodeFacts(): Promise<DaemonNode> {
  const info = await findDaemon().catch(() => undefined);
  if (info?.node) return { ...info.node, pid: info.pid };
  return { version: process.version, path: process.execPath };
}

function lineOf(version: string): number {
  return Number(/^v?(\d+)/.exec(version)?.[1]);
}

/** The daemon's Node: its version and path, and whether its line still gets security fixes. */
function daemonNode(node: DaemonNode): Check {
  const major = lineOf(node.version);
  const found = `${node.version} at ${node.path} (${node.pid ? `the running daemon, pid ${node.pid}` : '`abx daemon start` starts the daemon on it'})`;
  const end = NODE_END_OF_LIFE[major];
  if (major < 20) {
    return {
      name: 'node (daemon)',
      status: 'failed',
      required: true,
      found: `${found}: agent-sandbox needs Node 20 or newer`,
      fix: 'install Node 24 (or 22, 26) and start the daemon with it',
    };
  }
  if (end && Date.now() > Date.parse(end)) {
    return {
      name: 'node (daemon)',
      status: 'warning',
      required: true,
      found: `${found}: Node ${major} reached its end of life on ${end} (no more security fixes)`,
      fix: 'install Node 24 (or 22, 26) and start the daemon with it',
    };
  }
  return { name: 'node (daemon)', status: 'ok', required: true, found };
}

/** Building the portable runtime hashes and copies Node (~100 MB) the first time: give it room. */
const RUNTIME_TIMEOUT_MS = 120_000;

function within<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    work,
    new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`${what} did not finish within ${ms / 1000} s`)),
        ms,
      );
      timer.unref();
    }),
  ]).finally(() => clearTimeout(timer));
}

/** The runtime's Node started the way a sandbox starts it: through its own loader and libraries. */
async function runtimeNodeRuns(runtime: PortableRuntime): Promise<string | undefined> {
  const loader = runtime.libs.find((name) => name.startsWith('ld-'));
  const lib = join(runtime.dir, 'lib');
  const node = join(runtime.dir, 'bin', 'node');
  const [file, args] = loader
    ? [join(lib, loader), ['--library-path', lib, node, '--version']]
    : [node, ['--version']];
  const result = await probe(file, args, { timeoutMs: TIMEOUT.version });
  return result.ok
    ? undefined
    : probeFailure(result, `the portable runtime's Node (${runtime.dir})`, TIMEOUT.version);
}

/**
 * Which Node sandboxes get, and why: those without an image run the host's /usr Node when it is
 * a supported line, else the portable runtime (the daemon's Node at /opt/abx), decided by the
 * provider's own code (`noImageNode`) for the daemon this user would run; image sandboxes always
 * run the portable runtime. A warning when the two kinds run two lines, or when sandboxes
 * without an image are left on an unsupported Node, so that it is never unnoticed.
 */
async function sandboxNode(daemon: DaemonNode): Promise<Check> {
  const runtimeDir = join(packageInfo().root, 'dist', 'runtime');
  if (!existsSync(join(runtimeDir, 'envd.cjs'))) {
    return {
      name: 'node (sandboxes)',
      status: 'missing',
      required: true,
      found: `no envd at ${join(runtimeDir, 'envd.cjs')}`,
      fix: 'build the package (npm run build) or reinstall it',
    };
  }
  const images = `image sandboxes: Node ${daemon.version} (the portable runtime: the daemon's own)`;
  const cacheDir = localRuntimeCache();
  let choice: NoImageNode;
  try {
    choice = await within(
      noImageNode({
        daemon,
        // The runtime the daemon would build: of its Node, in its cache (a cache doctor may make).
        portable: () =>
          portableRuntime({
            runtimeDir,
            nodePath: daemon.path,
            ...(cacheDir ? { cacheDir } : {}),
          }),
      }),
      RUNTIME_TIMEOUT_MS,
      'choosing the sandboxes’ Node (building the portable runtime)',
    );
  } catch (error) {
    const message = (error as Error).message;
    return {
      name: 'node (sandboxes)',
      status: 'failed',
      required: true,
      found: `sandboxes without an image: no Node (${message})`,
      fix: 'apt-get install patchelf (the portable runtime needs it), or install Node 24 (or 22, 26) as /usr/bin/node',
    };
  }
  const details = {
    withoutImage: {
      runtime: choice.runtime,
      node: choice.node,
      version: choice.version,
      why: choice.why,
      host: choice.host,
      ...(choice.fallback ? { fallback: choice.fallback } : {}),
    },
    withImage: { runtime: 'portable', version: daemon.version },
  };
  const found = `sandboxes without an image: Node ${choice.version} (${choice.why}); ${images}`;
  if (choice.portable) {
    const broken = await runtimeNodeRuns(choice.portable);
    if (broken) {
      return {
        name: 'node (sandboxes)',
        status: 'failed',
        required: true,
        found: `${found}: ${broken}`,
        fix: `remove ${choice.portable.dir} so the daemon builds it again, and check that patchelf works (apt-get install patchelf)`,
        details,
      };
    }
    return { name: 'node (sandboxes)', status: 'ok', required: true, found, details };
  }
  if (choice.fallback) {
    return {
      name: 'node (sandboxes)',
      status: 'warning',
      required: true,
      found: `${found}: ${choice.fallback}`,
      fix: /patchelf/.test(choice.fallback)
        ? `apt-get install patchelf, so sandboxes without an image run the daemon's ${daemon.version}; or install Node 24 (or 22, 26) as ${choice.host.path}`
        : `see the message (the runtime is built from the daemon's Node with ldd and patchelf); or install Node 24 (or 22, 26) as ${choice.host.path}`,
      details,
    };
  }
  const host = lineOf(choice.version);
  const own = lineOf(daemon.version);
  if (!choice.supported) {
    return {
      name: 'node (sandboxes)',
      status: 'warning',
      required: true,
      found,
      fix: `install Node 24 (or 22, 26) as ${choice.host.path}, or start the daemon on one (sandboxes without an image then run its copy from the portable runtime)`,
      details,
    };
  }
  if (host !== own) {
    return {
      name: 'node (sandboxes)',
      status: 'warning',
      required: true,
      found: `${found}: two Node lines, ${host} in sandboxes without an image and ${own} in the daemon and image sandboxes`,
      fix: `run the daemon on ${choice.node} (abx daemon stop; abx daemon start with ${dirname(choice.node)} first on PATH), or install Node ${own} as ${choice.node}; a template whose code needs one line names it (runtime: { node: ${own} }), so its builds and creates fail instead of running on another`,
      details,
    };
  }
  return { name: 'node (sandboxes)', status: 'ok', required: true, found, details };
}

/** The host's Docker engine: where the local provider gets image templates' file systems. */
async function dockerEngine(root: boolean): Promise<Check> {
  const client = dockerClient();
  const address = engineAddress(client.docker);
  try {
    const facts = await Promise.race([
      probeEngine(client.docker),
      new Promise<never>((_, reject) =>
        setTimeout(
          () =>
            reject(
              new Error(
                `the Docker engine at ${address} did not answer within ${TIMEOUT.engine / 1000} s`,
              ),
            ),
          TIMEOUT.engine,
        ).unref(),
      ),
    ]);
    const found = `Docker ${facts.version} at ${address}${facts.rootless ? ' (rootless engine)' : ''}`;
    if (!root) {
      return {
        name: 'docker engine',
        status: 'warning',
        required: false,
        found: `${found}; the local provider runs image templates only as a root daemon`,
        fix: 'run the daemon as root, or use the docker provider (abx daemon start --provider docker)',
      };
    }
    if (!findProgram('patchelf', DAEMON_PATH)) {
      return {
        name: 'docker engine',
        status: 'warning',
        required: false,
        found: `${found}; no patchelf, which builds the portable Node runtime image sandboxes run on`,
        fix: 'apt-get install patchelf',
      };
    }
    return {
      name: 'docker engine',
      status: 'ok',
      required: false,
      found: `${found}: image templates run`,
    };
  } catch (error) {
    const message = (error as Error).message.replace(/; start it with.*$/, '');
    return {
      name: 'docker engine',
      status: 'warning',
      required: false,
      found: `${message}; image templates cannot run`,
      fix: /refused this user/.test(message)
        ? dockerGroupFix()
        : 'start one (sudo systemctl start docker, or dockerd &), or point DOCKER_HOST at a running engine; apt-get install docker.io to install it',
    };
  } finally {
    client.close();
  }
}

/**
 * The `internet` network, for real: a namespace of the sandbox's kind, its nftables rules (a
 * policy that denies every address, so nothing leaves) and slirp4netns from the egress
 * namespace, then all of it stopped. Optional: without it, templates that name no network run
 * offline, and those that name `internet` do not start.
 */
async function internetNetwork(root: boolean): Promise<Check> {
  const name = 'internet network';
  const offline = 'templates that name no network run offline; `network: internet` does not start';
  const missing = ['slirp4netns', 'nft', 'nsenter', 'unshare'].filter(
    (tool) => !findProgram(tool, DAEMON_PATH),
  );
  if (missing.length > 0) {
    return {
      name,
      status: 'missing',
      required: false,
      found: `no ${missing.join(', ')}: ${offline}`,
      fix: 'apt-get install slirp4netns nftables util-linux',
    };
  }
  const options = egressOptionsFromEnv(process.env, !root);
  const problem = egressProblem(options, !root);
  if (problem) {
    return {
      name,
      status: 'failed',
      required: false,
      found: `${problem}: ${offline}`,
      fix: 'fix or unset ABX_EGRESS_NETNS, ABX_EGRESS_USERNS and ABX_EGRESS_PERMIT (docs/network.md)',
    };
  }
  try {
    const net = await startSandboxNet({
      id: `doctor-${process.pid}`,
      rootless: !root,
      policy: { allowOut: [], denyOut: ['0.0.0.0/0'] },
      ports: { http: 9, tls: 9, dns: 9 },
      ...(options.netns ? { egressNetns: options.netns } : {}),
      ...(options.userns ? { egressUserns: options.userns } : {}),
    });
    stopSandboxNet(net);
  } catch (error) {
    return {
      name,
      status: 'failed',
      required: false,
      found: `${(error as Error).message}: ${offline}`,
      fix: root
        ? 'check that nftables works here (nft list ruleset) and that slirp4netns runs'
        : 'unprivileged user namespaces must be allowed (see the user namespaces check), and slirp4netns must run as this user',
    };
  }
  return {
    name,
    status: 'ok',
    required: false,
    found: `a namespace with nftables rules and slirp4netns started and stopped; egress from ${options.netns ?? 'this network namespace'}`,
  };
}

const PYTHON_PROBE = `
import sys
print(sys.version.split()[0])
for name in ('matplotlib', 'pandas'):
    try:
        print(name, __import__(name).__version__)
    except Exception as error:
        print(name, 'MISSING', type(error).__name__)
`;

/** The python3 a sandbox's code contexts run (the first on the sandbox's PATH), and its libraries. */
async function python(dir: string): Promise<Check> {
  const python3 = findProgram('python3', SANDBOX_PATH);
  if (!python3) {
    return {
      name: 'python3 (code)',
      status: 'missing',
      required: false,
      found: `no python3 in ${SANDBOX_PATH}: runCode and abx code in Python fail`,
      fix: 'apt-get install python3 python3-matplotlib python3-pandas',
    };
  }
  const config = join(dir, 'matplotlib');
  const result = await probe(python3, ['-c', PYTHON_PROBE], {
    timeoutMs: TIMEOUT.python,
    env: { PATH: SANDBOX_PATH, HOME: dir, MPLCONFIGDIR: config, MPLBACKEND: 'Agg' },
  });
  if (!result.ok) {
    return {
      name: 'python3 (code)',
      status: 'failed',
      required: false,
      found: probeFailure(result, python3, TIMEOUT.python),
      fix: 'apt-get install --reinstall python3',
    };
  }
  const [version, ...modules] = result.stdout.trim().split('\n');
  const missing = modules
    .filter((line) => line.includes('MISSING'))
    .map((line) => line.split(' ')[0]);
  const have = modules.filter((line) => !line.includes('MISSING')).join(', ');
  const found = `Python ${version} at ${python3}${have ? ` with ${have}` : ''}`;
  if (missing.length > 0) {
    return {
      name: 'python3 (code)',
      status: 'warning',
      required: false,
      found: `${found}; no ${missing.join(', ')}: charts and data frames in code contexts fail`,
      fix: `apt-get install ${missing.map((m) => `python3-${m}`).join(' ')}`,
    };
  }
  return { name: 'python3 (code)', status: 'ok', required: false, found };
}

/** The Chromium the command server's BROWSER group starts. */
async function chromium(dir: string): Promise<Check> {
  if (!existsSync(CHROMIUM)) {
    return {
      name: 'chromium (browser)',
      status: 'missing',
      required: false,
      found: `no ${CHROMIUM}: the command server's BROWSER group (/browser routes) cannot run`,
      fix: 'apt-get install chromium',
    };
  }
  const result = await probe(CHROMIUM, ['--version'], {
    timeoutMs: TIMEOUT.chromium,
    env: { PATH: SANDBOX_PATH, HOME: dir },
  });
  const version = /Chromium [\d.]+/.exec(result.stdout)?.[0];
  if (!result.ok || !version) {
    return {
      name: 'chromium (browser)',
      status: 'failed',
      required: false,
      found: probeFailure(result, `${CHROMIUM} --version`, TIMEOUT.chromium),
      fix: 'apt-get install --reinstall chromium',
    };
  }
  return {
    name: 'chromium (browser)',
    status: 'ok',
    required: false,
    found: `${version} at ${CHROMIUM}`,
  };
}

/**
 * `abx doctor` with no provider: whether the local provider can run sandboxes on this machine,
 * in the mode a daemon started by this user would run in. Every check probes for real (a user
 * namespace made, a sandbox started, a disk image formatted and mounted) with its own timeout.
 */
export async function localDoctor(): Promise<DoctorReport> {
  const root = process.getuid?.() === 0;
  const dir = mkdtempSync(join(tmpdir(), 'abx-doctor-'));
  const range = root ? uidRange() : undefined;
  try {
    const sandboxUid = range?.uid;
    const [bwrap, userns, disk, sandboxNodeCheck, docker, py, browser, internet] =
      await Promise.all([
        bubblewrap(),
        userNamespaces(sandboxUid),
        diskQuotas(root, dir),
        daemonNodeFacts().then(async (node) => ({ node, check: await sandboxNode(node) })),
        dockerEngine(root),
        python(dir),
        chromium(dir),
        internetNetwork(root),
      ]);
    const start =
      bwrap.path && bwrap.check.status === 'ok'
        ? await sandboxStart(bwrap.path, sandboxUid, dir)
        : undefined;
    const checks: Check[] = [
      bwrap.check,
      userns,
      ...(start ? [start] : []),
      range?.check ?? {
        name: 'uid range',
        status: 'ok',
        required: false,
        found: `not used: rootless sandboxes run as this user's uid ${process.getuid?.()}`,
      },
      cgroups(root),
      disk,
      daemonNode(sandboxNodeCheck.node),
      sandboxNodeCheck.check,
      internet,
      docker,
      py,
      browser,
    ];
    return reportOf('local', root ? 'root' : 'rootless', checks);
  } finally {
    range?.release();
    rmSync(dir, { recursive: true, force: true });
  }
}
