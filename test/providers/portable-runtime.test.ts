import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { SandboxStartError, UnavailableError } from '../../src/errors.js';
import {
  type PortableRuntime,
  portableRuntime,
  SANDBOX_NODE,
} from '../../src/providers/portable-runtime.js';
import { ROOT } from '../helpers/build.js';
import { BUSYBOX, busyboxRoot } from '../helpers/docker-images.js';

// Real sandboxes, no mocks: a root filesystem made of Debian's static busybox alone (no libc, no
// Node), the portable runtime bound at /opt/abx, run by bwrap. As root, bwrap runs as `nobody`,
// so the runtime must be readable by a uid that owns none of it.
const RUNTIME_DIR = join(ROOT, 'dist', 'runtime');
const NOBODY = 65534;
const asRoot = process.getuid?.() === 0;

/** Fails early, saying what to install, when a tool these tests need is missing. */
function requireTools(): void {
  for (const [tool, pkg] of [
    ['bwrap', 'bubblewrap'],
    ['patchelf', 'patchelf'],
    [BUSYBOX, 'busybox-static'],
  ]) {
    try {
      execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    } catch {
      throw new Error(`${tool} is missing: apt-get install -y ${pkg} (scripts/setup-system.sh)`);
    }
  }
  let linked = true;
  try {
    execFileSync('ldd', [BUSYBOX], { stdio: 'ignore' });
  } catch {
    linked = false; // ldd fails on a static binary: the one wanted
  }
  if (linked) throw new Error(`${BUSYBOX} links a libc: apt-get install -y busybox-static`);
}

let work: string;
let rootfs: string;
let runtime: PortableRuntime;

/** A folder `nobody` can enter, under the test's own temp folder. */
function scratch(name: string, mode = 0o755): string {
  const dir = join(work, `${name}-${randomBytes(3).toString('hex')}`);
  mkdirSync(dir, { mode });
  chmodSync(dir, mode);
  return dir;
}

/** The argv running `command` in the busybox root with `runtimeDir` at /opt/abx and `tmp` at /tmp. */
function sandboxArgv(runtimeDir: string, tmp: string, command: string[]): string[] {
  return [
    ...(asRoot ? ['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups'] : []),
    'bwrap',
    '--unshare-user',
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-net',
    '--die-with-parent',
    '--clearenv',
    '--setenv',
    'PATH',
    '/bin',
    '--ro-bind',
    rootfs,
    '/',
    '--ro-bind',
    runtimeDir,
    '/opt/abx',
    '--proc',
    '/proc',
    '--dev',
    '/dev',
    '--bind',
    tmp,
    '/tmp',
    '--',
    ...command,
  ];
}

/** Starts a sandbox in a process group of its own, so that one kill stops all it started. */
function startSandbox(runtimeDir: string, tmp: string, command: string[]): ChildProcess {
  const [file, ...args] = sandboxArgv(runtimeDir, tmp, command) as [string, ...string[]];
  return spawn(file, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
}

/**
 * Stops a sandbox and waits until none of its processes is left. bwrap's pid-namespace init is
 * killed first, so the outer bwrap sees it end, reaps it and exits; killing both at once would
 * orphan the init to the host's pid 1, which on some machines never reaps it (a zombie stays).
 */
async function stopSandbox(child: ChildProcess): Promise<void> {
  const group = child.pid as number;
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
  for (const pid of groupMembers(group).filter((pid) => pid !== group)) kill(pid);
  await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5_000))]);
  kill(-group);
  for (let i = 0; i < 500 && groupMembers(group).length > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

function kill(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

/** Live (non-zombie) processes of a process group. */
function groupMembers(group: number): number[] {
  return readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .filter((pid) => {
      try {
        const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
        const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        return fields[0] !== 'Z' && Number(fields[2]) === group;
      } catch {
        return false;
      }
    })
    .map(Number);
}

/** Runs a command in a sandbox to completion (30 s at most); stops it whatever happens. */
async function runInSandbox(
  command: string[],
  runtimeDir = runtime.dir,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const tmp = scratch('tmp', 0o1777);
  const child = startSandbox(runtimeDir, tmp, command);
  try {
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      stdout += chunk;
    });
    child.stderr?.on('data', (chunk: Buffer) => {
      stderr += chunk;
    });
    const code = await new Promise<number | null>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out: ${stderr}`)), 30_000);
      child.once('error', reject);
      child.once('close', (status) => {
        clearTimeout(timer);
        resolve(status);
      });
    });
    return { code, stdout, stderr };
  } finally {
    await stopSandbox(child);
    rmSync(tmp, { recursive: true, force: true });
  }
}

/** `[path below dir, octal mode]` of the folder and everything in it. */
function modesUnder(dir: string, below = ''): (readonly [string, string])[] {
  const mode = (path: string) => (statSync(path).mode & 0o7777).toString(8);
  const found = [[below || '/', mode(dir)] as const];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) found.push(...modesUnder(path, `${below}/${entry.name}`));
    else found.push([`${below}/${entry.name}`, mode(path)] as const);
  }
  return found;
}

beforeAll(async () => {
  requireTools();
  work = mkdtempSync(join(tmpdir(), 'abx-portable-'));
  chmodSync(work, 0o755);
  rootfs = join(work, 'rootfs');
  busyboxRoot(rootfs);
  runtime = await portableRuntime({ runtimeDir: RUNTIME_DIR, cacheDir: join(work, 'cache') });
}, 120_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the portable runtime folder', () => {
  test('holds node, its loader and libraries, and the runtime, readable by any uid', () => {
    expect(runtime.node).toBe(SANDBOX_NODE);
    expect(SANDBOX_NODE).toBe('/opt/abx/bin/node');
    expect(runtime.dir).toBe(join(work, 'cache', `portable-${runtime.hash}`));
    expect(runtime.built).toBe(true);
    expect(runtime.libs).toContain('libc.so.6');
    expect(runtime.libs).toContain('libstdc++.so.6');
    expect(runtime.libs.some((name) => /^ld-linux-(x86-64|aarch64)\.so\.\d$/.test(name))).toBe(
      true,
    );
    for (const file of ['envd.cjs', 'server.cjs', 'bin/node']) {
      expect(existsSync(join(runtime.dir, file)), file).toBe(true);
    }
    expect(runtime.bytes).toBeGreaterThan(statSync(process.execPath).size);

    const loader = runtime.libs.find((name) => name.startsWith('ld-')) as string;
    const executable = new Set([
      '/',
      '/bin',
      '/lib',
      '/bin/node',
      '/bin/script',
      '/bin/busybox',
      '/bin/sh',
      '/node-bin',
      '/node-bin/node',
      // The sudo shim a root-allowing sandbox gets at /usr/bin/sudo (runtime/root/sudo.ts).
      '/sudo-bin',
      '/sudo-bin/sudo',
      `/lib/${loader}`,
      // envd's front (native/envd-front), where the build had cargo.
      ...(existsSync(join(ROOT, 'dist', 'runtime', 'envd-front')) ? ['/envd-front'] : []),
    ]);
    const modes = modesUnder(runtime.dir);
    expect(modes).toEqual(
      modes.map(([path]) => [path, executable.has(path) ? '755' : '644'] as const),
    );
  });

  test('a second call reuses the folder without building it again', async () => {
    const node = statSync(join(runtime.dir, 'bin', 'node'));
    const again = await portableRuntime({ runtimeDir: RUNTIME_DIR, cacheDir: join(work, 'cache') });
    expect(again).toEqual({ ...runtime, built: false });
    const after = statSync(join(runtime.dir, 'bin', 'node'));
    expect([after.ino, after.mtimeMs]).toEqual([node.ino, node.mtimeMs]);
    expect(readdirSync(join(work, 'cache'))).toEqual([`portable-${runtime.hash}`]);
  });

  test('two concurrent builds end with one complete folder that runs', async () => {
    const cacheDir = scratch('race');
    const [a, b] = await Promise.all([
      portableRuntime({ runtimeDir: RUNTIME_DIR, cacheDir }),
      portableRuntime({ runtimeDir: RUNTIME_DIR, cacheDir }),
    ]);
    expect(a?.dir).toBe(b?.dir);
    expect([a?.built, b?.built].sort()).toEqual([false, true]);
    // The loser removed its copy: nothing half-built is left beside the winner's.
    expect(readdirSync(cacheDir)).toEqual([`portable-${runtime.hash}`]);
    const result = await runInSandbox([SANDBOX_NODE, '-p', '6 * 7'], a?.dir);
    expect(result).toMatchObject({ code: 0, stdout: '42\n' });
    rmSync(cacheDir, { recursive: true, force: true });
  });

  test('a runtime folder without envd.cjs is refused, naming what is missing', async () => {
    const incomplete = scratch('incomplete');
    writeFileSync(join(incomplete, 'server.cjs'), '');
    const error = await portableRuntime({
      runtimeDir: incomplete,
      cacheDir: scratch('cache'),
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(SandboxStartError);
    expect((error as Error).message).toBe(
      `the runtime folder ${incomplete} has no envd.cjs; build the package (npm run build)`,
    );
  });

  test('a Node binary that is not an ELF is refused', async () => {
    const error = await portableRuntime({
      runtimeDir: RUNTIME_DIR,
      cacheDir: scratch('cache'),
      nodePath: join(RUNTIME_DIR, 'envd.cjs'),
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(UnavailableError);
    expect((error as Error).message).toMatch(/is not an ELF binary/);
  });
});

describe('in a busybox root filesystem (no libc, no Node)', () => {
  test('the rootfs really has no libc', async () => {
    const result = await runInSandbox(['/bin/sh', '-c', 'ls / /opt/abx; ls /lib 2>&1; true']);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/No such file or directory/);
  });

  test('/opt/abx/bin/node runs directly', async () => {
    const result = await runInSandbox([
      SANDBOX_NODE,
      '-e',
      'console.log(process.version, require("os").platform(), process.execPath)',
    ]);
    expect(result).toEqual({
      code: 0,
      stdout: `${process.version} linux /opt/abx/bin/node\n`,
      stderr: '',
    });
  });

  test('/opt/abx/node-bin holds only node (what a sandbox puts first on PATH for it), which runs', async () => {
    expect(readdirSync(join(runtime.dir, 'node-bin'))).toEqual(['node']);
    const result = await runInSandbox([
      '/bin/sh',
      '-c',
      'PATH=/opt/abx/node-bin:/bin; command -v node; node -p process.execPath',
    ]);
    expect(result).toEqual({
      code: 0,
      stdout: '/opt/abx/node-bin/node\n/opt/abx/bin/node\n',
      stderr: '',
    });
  });

  test('children started with process.execPath, and the image own programs, run too', async () => {
    const script = `
      const { execFileSync } = require('node:child_process');
      const child = execFileSync(process.execPath, ['-p', 'process.pid > 1'], { encoding: 'utf8' });
      const shell = execFileSync('/bin/sh', ['-c', 'echo from $(readlink /bin/sh)'], { encoding: 'utf8' });
      process.stdout.write(child + shell);
    `;
    const result = await runInSandbox([SANDBOX_NODE, '-e', script]);
    expect(result).toEqual({ code: 0, stdout: 'true\nfrom busybox\n', stderr: '' });
  });

  test('util-linux script comes along, so terminals get a pty where the image has no script', async () => {
    expect(existsSync(join(runtime.dir, 'bin', 'script'))).toBe(existsSync('/usr/bin/script'));
    const result = await runInSandbox([
      '/opt/abx/bin/script',
      '-qefc',
      'tty; echo in-pty',
      '/dev/null',
    ]);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^\/dev\/pts\/\d+\r?\nin-pty/);
  });

  test('envd starts and runs commands with busybox sh', async () => {
    const tmp = scratch('envd', 0o1777);
    const token = randomBytes(16).toString('hex');
    writeFileSync(join(tmp, 'token'), token, { mode: 0o600 });
    if (asRoot) chownSync(join(tmp, 'token'), NOBODY, NOBODY);
    const child = startSandbox(runtime.dir, tmp, [
      SANDBOX_NODE,
      '/opt/abx/envd.cjs',
      '--socket',
      '/tmp/e.sock',
      '--ports-dir',
      '/tmp/ports',
      '--token-file',
      '/tmp/token',
    ]);
    try {
      let log = '';
      child.stderr?.on('data', (chunk: Buffer) => {
        log += chunk;
      });
      const listening = await new Promise<string>((resolve, reject) => {
        let out = '';
        const timer = setTimeout(() => reject(new Error(`envd did not start: ${log}`)), 20_000);
        child.once('exit', (code) => reject(new Error(`envd exited ${code}: ${log}`)));
        child.stdout?.on('data', (chunk: Buffer) => {
          out += chunk;
          if (out.includes('\n')) {
            clearTimeout(timer);
            resolve(out);
          }
        });
      });
      expect(JSON.parse(listening)).toMatchObject({ event: 'listening', socket: '/tmp/e.sock' });
      // envd read the token and removed it before serving.
      expect(existsSync(join(tmp, 'token'))).toBe(false);

      const socket = join(tmp, 'e.sock');
      const { status, body } = await envdRequest<{ stdout: string; exit_code: number }>(
        socket,
        token,
        'POST',
        '/process/exec',
        { cmd: 'echo hi; readlink /bin/sh', timeout: 10 },
      );
      expect({ status, body }).toMatchObject({
        status: 200,
        body: { stdout: 'hi\nbusybox\n', exit_code: 0 },
      });
      const denied = await envdRequest(socket, 'wrong', 'POST', '/process/exec', { cmd: 'true' });
      expect(denied.status).toBe(401);

      await stopSandbox(child);
      expect(groupMembers(child.pid as number)).toEqual([]);
    } finally {
      await stopSandbox(child);
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});
