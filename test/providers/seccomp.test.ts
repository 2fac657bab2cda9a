import { spawn } from 'node:child_process';
import {
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  BPF_INSTRUCTION_SIZE,
  BPF_MAX_INSTRUCTIONS,
  BpfAssembler,
  type BpfInstruction,
  decodeBpf,
  NEXT,
} from '../../src/providers/local/bpf.js';
import { processStartTime } from '../../src/providers/local/proc.js';
import {
  compileSeccompFilter,
  DENIED_SYSCALLS,
  type SeccompArch,
} from '../../src/providers/local/seccomp.js';

// Written out here rather than imported, so a wrong constant in the generator cannot hide.
const RET_KILL_PROCESS = 0x80000000;
const RET_ALLOW = 0x7fff0000;
const RET_EPERM = 0x00050001;
const RET_ENOSYS = 0x00050026;
const AUDIT_ARCH = { x64: 0xc000003e, arm64: 0xc00000b7, i386: 0x40000003, arm: 0x40000028 };

/** Syscall numbers the tests need on each arch, from the same kernel tables. */
const NR = {
  x64: { read: 0, write: 1, openat: 257, execve: 59, ptrace: 101, clone: 56, clone3: 435 },
  arm64: { read: 63, write: 64, openat: 56, execve: 221, ptrace: 117, clone: 220, clone3: 435 },
} as const;
const IOCTL = { x64: 16, arm64: 29 } as const;
const PERSONALITY = { x64: 135, arm64: 92 } as const;
const PROCESS_MADVISE = { x64: 440, arm64: 440 } as const;

const CLONE_NAMESPACE_FLAGS = {
  CLONE_NEWTIME: 0x80,
  CLONE_NEWNS: 0x20000,
  CLONE_NEWCGROUP: 0x02000000,
  CLONE_NEWUTS: 0x04000000,
  CLONE_NEWIPC: 0x08000000,
  CLONE_NEWUSER: 0x10000000,
  CLONE_NEWPID: 0x20000000,
  CLONE_NEWNET: 0x40000000,
};
/** What glibc's pthread_create passes to clone. */
const CLONE_THREAD_FLAGS = 0x3d0f00;
const SIGCHLD = 17;
const TIOCSTI = 0x5412;
const TIOCLINUX = 0x541c;
const TCGETS = 0x5401;
const FIONREAD = 0x541b;

interface SeccompData {
  nr: number;
  arch: number;
  args?: bigint[];
}

/** A classic-BPF interpreter for the opcodes a seccomp program may use, run on seccomp_data. */
function runBpf(program: readonly BpfInstruction[], data: SeccompData): number {
  const bytes = Buffer.alloc(64);
  bytes.writeInt32LE(data.nr | 0, 0);
  bytes.writeUInt32LE(data.arch, 4);
  (data.args ?? []).forEach((arg, index) => {
    bytes.writeBigUInt64LE(BigInt.asUintN(64, arg), 16 + 8 * index);
  });
  let a = 0;
  let pc = 0;
  while (pc < program.length) {
    const { code, jt, jf, k } = program[pc];
    switch (code) {
      case 0x20: // BPF_LD | BPF_W | BPF_ABS
        if (k % 4 !== 0 || k + 4 > bytes.length) throw new Error(`bad load offset ${k}`);
        a = bytes.readUInt32LE(k);
        pc += 1;
        break;
      case 0x15: // JEQ
        pc += 1 + (a === k ? jt : jf);
        break;
      case 0x25: // JGT
        pc += 1 + (a > k ? jt : jf);
        break;
      case 0x35: // JGE
        pc += 1 + (a >= k ? jt : jf);
        break;
      case 0x45: // JSET
        pc += 1 + ((a & k) !== 0 ? jt : jf);
        break;
      case 0x06: // RET K
        return k;
      default:
        throw new Error(`unknown opcode 0x${code.toString(16)} at ${pc}`);
    }
  }
  throw new Error('ran off the end of the program');
}

const ARCHES: SeccompArch[] = ['x64', 'arm64'];

describe.each(ARCHES)('the %s seccomp filter', (arch) => {
  const bytes = compileSeccompFilter(arch);
  const program = decodeBpf(bytes);
  const nr = NR[arch];
  const run = (syscall: number, args: (number | bigint)[] = []) =>
    runBpf(program, { nr: syscall, arch: AUDIT_ARCH[arch], args: args.map(BigInt) });
  const denied = DENIED_SYSCALLS.filter((s) => s[arch] !== undefined);

  test('is a well-formed program the kernel accepts', () => {
    expect(bytes.length % BPF_INSTRUCTION_SIZE).toBe(0);
    expect(program.length).toBeGreaterThan(denied.length);
    expect(program.length).toBeLessThanOrEqual(BPF_MAX_INSTRUCTIONS);
    program.forEach(({ code, jt, jf }, pc) => {
      expect([0x20, 0x15, 0x35, 0x45, 0x06]).toContain(code);
      if ((code & 0x07) === 0x05) {
        expect(pc + 1 + jt).toBeLessThan(program.length);
        expect(pc + 1 + jf).toBeLessThan(program.length);
      }
    });
    expect(program[program.length - 1].code).toBe(0x06);
  });

  test('kills a process of another architecture', () => {
    const foreign =
      arch === 'x64' ? [AUDIT_ARCH.i386, AUDIT_ARCH.arm64] : [AUDIT_ARCH.arm, AUDIT_ARCH.x64];
    for (const auditArch of foreign) {
      expect(runBpf(program, { nr: nr.read, arch: auditArch })).toBe(RET_KILL_PROCESS);
    }
  });

  test('refuses every denied syscall with EPERM, whatever its arguments', () => {
    expect(denied.length).toBeGreaterThan(30);
    for (const syscall of denied) {
      const number = syscall[arch] as number;
      expect(run(number), syscall.name).toBe(RET_EPERM);
      expect(run(number, [0, 0x3d0f00, -1, 1n << 40n]), syscall.name).toBe(RET_EPERM);
    }
  });

  test('answers clone3 with ENOSYS so libc falls back to clone', () => {
    expect(run(nr.clone3)).toBe(RET_ENOSYS);
  });

  test('refuses clone with any namespace flag and allows threads and forks', () => {
    for (const [name, flag] of Object.entries(CLONE_NAMESPACE_FLAGS)) {
      expect(run(nr.clone, [flag | SIGCHLD]), name).toBe(RET_EPERM);
      expect(run(nr.clone, [BigInt(flag) | (0xffn << 32n)]), name).toBe(RET_EPERM);
    }
    expect(run(nr.clone, [CLONE_THREAD_FLAGS])).toBe(RET_ALLOW);
    expect(run(nr.clone, [SIGCHLD])).toBe(RET_ALLOW);
    // The kernel drops clone's high 32 bits, so they cannot request a namespace.
    expect(run(nr.clone, [(0x10000000n << 32n) | BigInt(SIGCHLD)])).toBe(RET_ALLOW);
  });

  test('refuses the ioctls that inject terminal input and allows others', () => {
    expect(run(IOCTL[arch], [0, TIOCSTI, 0])).toBe(RET_EPERM);
    expect(run(IOCTL[arch], [0, TIOCLINUX, 0])).toBe(RET_EPERM);
    // The kernel reads the request as 32 bits: high bits must not get TIOCSTI through.
    expect(run(IOCTL[arch], [0, (1n << 32n) | BigInt(TIOCSTI), 0])).toBe(RET_EPERM);
    expect(run(IOCTL[arch], [0, TCGETS, 0])).toBe(RET_ALLOW);
    expect(run(IOCTL[arch], [1, FIONREAD, 0])).toBe(RET_ALLOW);
    // TIOCSTI as the fd or the argument is not the request.
    expect(run(IOCTL[arch], [TIOCSTI, TCGETS, TIOCSTI])).toBe(RET_ALLOW);
  });

  test("allows only Docker's personalities", () => {
    for (const persona of [0x0, 0x8, 0x20000, 0x20008, 0xffffffff]) {
      expect(run(PERSONALITY[arch], [persona]), persona.toString(16)).toBe(RET_ALLOW);
    }
    for (const persona of [0x40000 /* ADDR_NO_RANDOMIZE */, 0x400000 /* READ_IMPLIES_EXEC */, 1]) {
      expect(run(PERSONALITY[arch], [persona]), persona.toString(16)).toBe(RET_EPERM);
    }
  });

  test('allows ordinary syscalls, ptrace included', () => {
    for (const syscall of [
      nr.read,
      nr.write,
      nr.openat,
      nr.execve,
      nr.ptrace,
      PROCESS_MADVISE[arch],
    ]) {
      expect(run(syscall, [3, 0, 0]), String(syscall)).toBe(RET_ALLOW);
    }
  });

  test('allows every other syscall number', () => {
    const special = new Set<number>([
      ...denied.map((s) => s[arch] as number),
      nr.clone,
      nr.clone3,
      IOCTL[arch],
      PERSONALITY[arch],
    ]);
    for (let syscall = 0; syscall < 1024; syscall++) {
      if (!special.has(syscall))
        expect(run(syscall, [0x7fffffff, -1]), String(syscall)).toBe(RET_ALLOW);
    }
  });

  if (arch === 'x64') {
    test('refuses the x32 ABI but not the "no syscall" number ptrace uses to skip one', () => {
      const X32 = 0x40000000;
      expect(run(X32 + nr.read)).toBe(RET_EPERM);
      expect(run(X32 + nr.execve)).toBe(RET_EPERM);
      expect(run(X32 + 520)).toBe(RET_EPERM);
      expect(run(-1)).toBe(RET_ALLOW);
    });
  }
});

describe('DENIED_SYSCALLS', () => {
  test('has one entry per name and one number per syscall on each arch', () => {
    const names = DENIED_SYSCALLS.map((s) => s.name);
    expect(new Set(names).size).toBe(names.length);
    for (const arch of ARCHES) {
      const numbers = DENIED_SYSCALLS.flatMap((s) => (s[arch] === undefined ? [] : [s[arch]]));
      expect(new Set(numbers).size, arch).toBe(numbers.length);
      expect(numbers, arch).not.toContain(NR[arch].ptrace);
    }
  });

  // The host's kernel headers are generated from the same tables; check against them when present.
  const headers: [SeccompArch, string, RegExp][] = [
    ['x64', '/usr/include/x86_64-linux-gnu/asm/unistd_64.h', /^#define __NR_(\w+)\s+(\d+)/gm],
    ['arm64', '/usr/include/asm-generic/unistd.h', /^#define __NR(?:3264)?_(\w+)\s+(\d+)/gm],
  ];
  test.each(headers)('matches the kernel headers for %s', (arch, path, pattern) => {
    if (!existsSync(path)) return;
    const table = new Map<string, number>();
    for (const [, name, number] of readFileSync(path, 'utf8').matchAll(pattern)) {
      table.set(name, Number(number));
    }
    for (const syscall of DENIED_SYSCALLS) {
      expect(syscall[arch], `${syscall.name} on ${arch}`).toBe(table.get(syscall.name));
    }
    for (const [name, number] of Object.entries(NR[arch])) {
      expect(number, name).toBe(table.get(name));
    }
    expect(IOCTL[arch]).toBe(table.get('ioctl'));
    expect(PERSONALITY[arch]).toBe(table.get('personality'));
  });
});

describe('the BPF assembler', () => {
  test('resolves forward labels and NEXT into relative offsets', () => {
    const program = new BpfAssembler()
      .load(0)
      .jeq(1, 'one', NEXT)
      .jeq(2, 'two', 'one')
      .label('one')
      .ret(1)
      .label('two')
      .ret(2)
      .assemble();
    expect(program.map(({ jt, jf }) => [jt, jf])).toEqual([
      [0, 0],
      [1, 0],
      [1, 0],
      [0, 0],
      [0, 0],
    ]);
    expect(runBpf(program, { nr: 1, arch: 0 })).toBe(1);
    expect(runBpf(program, { nr: 2, arch: 0 })).toBe(2);
    expect(runBpf(program, { nr: 3, arch: 0 })).toBe(1);
  });

  test('refuses jumps over 255 instructions, backwards or to nowhere', () => {
    const far = new BpfAssembler().load(0).jeq(1, 'end');
    for (let i = 0; i < 256; i++) far.ret(0);
    expect(() => far.label('end').ret(1).assemble()).toThrow(/256 > 255/);

    const fits = new BpfAssembler().load(0).jeq(1, 'end');
    for (let i = 0; i < 255; i++) fits.ret(0);
    expect(fits.label('end').ret(1).assemble()[1].jt).toBe(255);

    expect(() => new BpfAssembler().label('back').load(0).jeq(1, 'back').assemble()).toThrow(
      /behind/,
    );
    expect(() => new BpfAssembler().jeq(1, 'missing').ret(0).assemble()).toThrow(/not defined/);
    expect(() => new BpfAssembler().ret(-1)).toThrow();
  });
});

// ---------------------------------------------------------------------------------------------
// The filter on the real kernel, installed by bubblewrap.

const BWRAP = '/usr/bin/bwrap';
const PYTHON = '/usr/bin/python3';
const HOST_ARCH = process.arch === 'x64' || process.arch === 'arm64' ? process.arch : undefined;
const canRunBwrap = existsSync(BWRAP) && existsSync(PYTHON) && HOST_ARCH !== undefined;
/** As root, the sandbox is started by an unprivileged uid with no passwd entry. */
const TEST_UID = 1500000123;
const asRoot = process.getuid?.() === 0;

interface Result {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

describe.runIf(canRunBwrap)('bubblewrap with the filter', () => {
  let dir: string;
  let filterPath: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'abx-seccomp-'));
    filterPath = join(dir, 'filter.bpf');
    writeFileSync(filterPath, compileSeccompFilter());
  });

  afterAll(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  /** Runs `command` in a minimal sandbox, with the filter on fd 3 unless `seccomp` is false. */
  async function sandbox(command: string[], { seccomp = true } = {}): Promise<Result> {
    const args = [
      '--unshare-user',
      '--uid',
      '1000',
      '--gid',
      '1000',
      '--disable-userns',
      '--unshare-pid',
      '--unshare-net',
      '--die-with-parent',
      '--ro-bind',
      '/usr',
      '/usr',
      '--symlink',
      'usr/bin',
      '/bin',
      '--symlink',
      'usr/lib',
      '/lib',
      '--symlink',
      'usr/lib64',
      '/lib64',
      '--ro-bind',
      '/etc',
      '/etc',
      '--proc',
      '/proc',
      '--dev',
      '/dev',
      '--tmpfs',
      '/tmp',
      '--chdir',
      '/tmp',
      ...(seccomp ? ['--seccomp', '3'] : []),
      '--',
      ...command,
    ];
    const fd = openSync(filterPath, 'r');
    let sandboxPid: number | undefined;
    try {
      const child = spawn(BWRAP, ['--info-fd', '4', ...args], {
        stdio: ['ignore', 'pipe', 'pipe', fd, 'pipe'],
        cwd: '/',
        env: { PATH: '/usr/bin:/bin', HOME: '/tmp', LANG: 'C.UTF-8' },
        ...(asRoot ? { uid: TEST_UID, gid: TEST_UID } : {}),
      });
      try {
        let stdout = '';
        let stderr = '';
        let info = '';
        child.stdout?.on('data', (chunk) => {
          stdout += chunk;
        });
        child.stderr?.on('data', (chunk) => {
          stderr += chunk;
        });
        child.stdio[4]?.on('data', (chunk) => {
          // bwrap writes its info JSON in pieces: read the pid once it has arrived whole.
          info += chunk;
          const pid = /"child-pid":\s*(\d+)/.exec(info)?.[1];
          if (pid) sandboxPid = Number(pid);
        });
        const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>(
          (resolve, reject) => {
            child.on('error', reject);
            child.on('close', (c, s) => resolve([c, s]));
          },
        );
        return { code, signal, stdout, stderr };
      } finally {
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
        if (sandboxPid !== undefined) await waitUntilGone(sandboxPid);
      }
    } finally {
      closeSync(fd);
    }
  }

  /** Calls each syscall through ctypes and reports its errno (0 when it succeeded). */
  async function probe(
    probes: Record<string, [number, ...(number | string)[]]>,
    options?: { seccomp?: boolean },
  ): Promise<Record<string, number>> {
    const script = `
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {}
for name, (nr, *args) in json.loads(sys.argv[1]).items():
    args = [ctypes.c_char_p(a.encode()) if isinstance(a, str) else ctypes.c_long(a) for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *args)
    if r == 0 and name.startswith("fork "):
        os._exit(0)
    if r > 0 and name.startswith("fork "):
        os.waitpid(r, 0)
    results[name] = ctypes.get_errno() if r == -1 else 0
print(json.dumps(results))
`;
    const result = await sandbox([PYTHON, '-c', script, JSON.stringify(probes)], options);
    expect(result, result.stderr).toMatchObject({ code: 0 });
    return JSON.parse(result.stdout);
  }

  const arch = HOST_ARCH as SeccompArch;
  const number = (name: string) => {
    const found = DENIED_SYSCALLS.find((s) => s.name === name)?.[arch];
    if (found === undefined) throw new Error(`${name} is not denied on ${arch}`);
    return found;
  };
  const EPERM = 1;
  const ENOSYS = 38;
  const ENOTTY = 25;
  const KEYCTL_GET_KEYRING_ID = 0;
  const KEY_SPEC_SESSION_KEYRING = -3;
  const KEY_SPEC_PROCESS_KEYRING = -2;
  const AT_FDCWD = -100;

  // Arguments are harmless should a call get through: null pointers, bad fds, tiny sizes.
  const probes = (): Record<string, [number, ...(number | string)[]]> => ({
    keyctl: [number('keyctl'), KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0],
    add_key: [number('add_key'), 'user', 'abx-probe', 'x', 1, KEY_SPEC_PROCESS_KEYRING],
    request_key: [number('request_key'), 'user', 'abx-missing', 0, 0],
    bpf: [number('bpf'), 0, 0, 0],
    perf_event_open: [number('perf_event_open'), 0, 0, -1, -1, 0],
    userfaultfd: [number('userfaultfd'), 0],
    mount: [number('mount'), 'none', '/tmp', 'tmpfs', 0, 0],
    umount2: [number('umount2'), '/tmp', 0],
    fsopen: [number('fsopen'), 'tmpfs', 0],
    'unshare(CLONE_NEWUSER)': [number('unshare'), CLONE_NAMESPACE_FLAGS.CLONE_NEWUSER],
    setns: [number('setns'), -1, 0],
    io_uring_setup: [number('io_uring_setup'), 1, 0],
    kexec_load: [number('kexec_load'), 0, 0, 0, 0],
    init_module: [number('init_module'), 0, 0, ''],
    name_to_handle_at: [number('name_to_handle_at'), AT_FDCWD, '/', 0, 0, 0],
    kcmp: [number('kcmp'), 1, 1, 0, 0, 0],
    'fork clone(CLONE_NEWUSER)': [
      NR[arch].clone,
      CLONE_NAMESPACE_FLAGS.CLONE_NEWUSER | SIGCHLD,
      0,
      0,
      0,
      0,
    ],
    'fork clone(CLONE_NEWNET)': [
      NR[arch].clone,
      CLONE_NAMESPACE_FLAGS.CLONE_NEWNET | SIGCHLD,
      0,
      0,
      0,
      0,
    ],
    'ioctl(TIOCSTI)': [IOCTL[arch], 0, TIOCSTI, 0],
    'ioctl(TIOCSTI | 1 << 32)': [IOCTL[arch], 0, 2 ** 32 + TIOCSTI, 0],
    'personality(ADDR_NO_RANDOMIZE)': [PERSONALITY[arch], 0x40000],
    clone3: [NR[arch].clone3, 0, 0],
    'ioctl(TCGETS)': [IOCTL[arch], 0, TCGETS, 0],
    'personality(query)': [PERSONALITY[arch], 0xffffffff],
  });

  test('refuses the denied syscalls with EPERM and clone3 with ENOSYS', async () => {
    const results = await probe(probes());
    const { clone3, 'ioctl(TCGETS)': tcgets, 'personality(query)': query, ...refused } = results;
    for (const [name, errno] of Object.entries(refused)) expect(errno, name).toBe(EPERM);
    expect(clone3).toBe(ENOSYS);
    // Allowed calls reach the kernel: stdin is /dev/null, not a terminal.
    expect(tcgets).toBe(ENOTTY);
    expect(query).toBe(0);
  });

  test('without the filter the same probes get other answers (so the filter made the EPERMs)', async () => {
    const results = await probe(probes(), { seccomp: false });
    // Only probes whose unfiltered answer does not hang on host sysctls or kernel options.
    for (const name of [
      'keyctl',
      'add_key',
      'request_key',
      'setns',
      'kcmp',
      'name_to_handle_at',
      'unshare(CLONE_NEWUSER)',
      'fork clone(CLONE_NEWUSER)',
      'ioctl(TIOCSTI)',
      'ioctl(TIOCSTI | 1 << 32)',
      'personality(ADDR_NO_RANDOMIZE)',
    ]) {
      expect(results[name], name).not.toBe(EPERM);
    }
    expect(results.clone3).not.toBe(ENOSYS);
  });

  test('unshare(1) cannot make a user namespace', async () => {
    for (const flag of ['-r', '-U']) {
      const result = await sandbox(['unshare', flag, 'true']);
      expect(result.code, flag).not.toBe(0);
      expect(result.stderr, flag).toMatch(/Operation not permitted/);
    }
  });

  test('a shell, Python threads and /proc work', async () => {
    expect(await sandbox(['sh', '-c', 'echo ok'])).toMatchObject({ code: 0, stdout: 'ok\n' });

    const threads = `
import threading
out = []
t = threading.Thread(target=lambda: out.append("thread ok"))
t.start(); t.join()
print(out[0])
`;
    expect(await sandbox([PYTHON, '-c', threads])).toMatchObject({
      code: 0,
      stdout: 'thread ok\n',
    });

    const ls = await sandbox(['ls', '/proc']);
    expect(ls.code).toBe(0);
    expect(ls.stdout.split('\n')).toEqual(expect.arrayContaining(['1', 'self', 'cpuinfo']));
  });

  test.runIf(existsSync('/usr/bin/node'))(
    'Node starts workers, child processes and file I/O',
    async () => {
      const script = `
const { Worker } = require('node:worker_threads');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
(async () => {
  const fromWorker = await new Promise((resolve, reject) => {
    const worker = new Worker("require('node:worker_threads').parentPort.postMessage('worker ok')", { eval: true });
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  const fromChild = execFileSync('/bin/sh', ['-c', 'echo child ok']).toString().trim();
  const file = await fs.promises.readFile('/etc/os-release', 'utf8');
  console.log([fromWorker, fromChild, file.includes('NAME=') ? 'fs ok' : 'fs bad'].join(','));
})().catch((error) => { console.error(error); process.exit(1); });
`;
      const result = await sandbox(['/usr/bin/node', '-e', script]);
      expect(result, result.stderr).toMatchObject({
        code: 0,
        stdout: 'worker ok,child ok,fs ok\n',
      });
    },
  );

  test('a process can still ptrace its child', async () => {
    const script = `
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_TRACEME, PTRACE_CONT = 0, 7
pid = os.fork()
if pid == 0:
    if libc.ptrace(PTRACE_TRACEME, 0, None, None) != 0:
        os._exit(10 + ctypes.get_errno())
    os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.WIFSTOPPED(status), status
assert libc.ptrace(PTRACE_CONT, pid, None, None) == 0, ctypes.get_errno()
_, status = os.waitpid(pid, 0)
print("traced", os.WEXITSTATUS(status))
`;
    expect(await sandbox([PYTHON, '-c', script])).toMatchObject({ code: 0, stdout: 'traced 0\n' });
  });

  test.runIf(existsSync('/usr/bin/strace'))('strace works', async () => {
    const result = await sandbox(['strace', '-f', '-e', 'trace=write', 'sh', '-c', 'echo traced']);
    expect(result, result.stderr).toMatchObject({ code: 0, stdout: 'traced\n' });
    expect(result.stderr).toMatch(/write\(1, "traced\\n", 7\)\s+= 7/);
  });
});

/**
 * Waits for the sandbox's pid 1 (a host pid) to end. The kernel kills and reaps the rest of its
 * pid namespace before pid 1 becomes a zombie, so nothing the sandbox started outlives it; the
 * zombie itself is left to the host's init, which may reap it late.
 */
async function waitUntilGone(pid: number): Promise<void> {
  for (let waited = 0; processStartTime(pid) !== undefined; waited += 20) {
    if (waited >= 5_000) {
      process.kill(pid, 'SIGKILL');
      throw new Error(`sandbox pid ${pid} still runs after its bwrap ended`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
