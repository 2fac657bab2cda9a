import { BpfAssembler, encodeBpf, NEXT } from './bpf.js';

/** CPU architectures the sandbox seccomp filter is compiled for (Node's `process.arch` names). */
export type SeccompArch = 'x64' | 'arm64';

/** A syscall the filter refuses with EPERM, with its number on each arch that has it. */
export interface DeniedSyscall {
  name: string;
  x64?: number;
  arm64?: number;
}

/**
 * Syscalls refused with EPERM, in the spirit of Docker's default profile. Numbers come from the
 * kernel's arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h (arm64);
 * a syscall missing on an arch has no number there. umount, stime, vm86 and vm86old exist only
 * on 32-bit ABIs, which the architecture check already kills.
 */
export const DENIED_SYSCALLS: readonly DeniedSyscall[] = [
  // Loading kernel code or booting another kernel.
  { name: 'create_module', x64: 174 },
  { name: 'delete_module', x64: 176, arm64: 106 },
  { name: 'finit_module', x64: 313, arm64: 273 },
  { name: 'get_kernel_syms', x64: 177 },
  { name: 'init_module', x64: 175, arm64: 105 },
  { name: 'kexec_file_load', x64: 320, arm64: 294 },
  { name: 'kexec_load', x64: 246, arm64: 104 },
  // The mount tree is fixed by bubblewrap; changing it could uncover what it hides.
  { name: 'mount', x64: 165, arm64: 40 },
  { name: 'umount2', x64: 166, arm64: 39 },
  { name: 'pivot_root', x64: 155, arm64: 41 },
  { name: 'open_tree', x64: 428, arm64: 428 },
  { name: 'move_mount', x64: 429, arm64: 429 },
  { name: 'fsopen', x64: 430, arm64: 430 },
  { name: 'fsconfig', x64: 431, arm64: 431 },
  { name: 'fsmount', x64: 432, arm64: 432 },
  { name: 'fspick', x64: 433, arm64: 433 },
  { name: 'mount_setattr', x64: 442, arm64: 442 },
  // New or foreign namespaces (clone's namespace flags are checked separately).
  { name: 'unshare', x64: 272, arm64: 97 },
  { name: 'setns', x64: 308, arm64: 268 },
  // The kernel keyring is not namespaced: keys would be shared with the host.
  { name: 'add_key', x64: 248, arm64: 217 },
  { name: 'keyctl', x64: 250, arm64: 219 },
  { name: 'request_key', x64: 249, arm64: 218 },
  // The host's clock is not namespaced.
  { name: 'clock_adjtime', x64: 305, arm64: 266 },
  { name: 'clock_settime', x64: 227, arm64: 112 },
  { name: 'settimeofday', x64: 164, arm64: 170 },
  // Host administration: accounting, quotas, swap, reboot, the kernel log, obsolete interfaces.
  { name: 'acct', x64: 163, arm64: 89 },
  { name: 'quotactl', x64: 179, arm64: 60 },
  { name: 'quotactl_fd', x64: 443, arm64: 443 },
  { name: 'reboot', x64: 169, arm64: 142 },
  { name: 'swapon', x64: 167, arm64: 224 },
  { name: 'swapoff', x64: 168, arm64: 225 },
  { name: 'syslog', x64: 103, arm64: 116 },
  { name: 'nfsservctl', x64: 180, arm64: 42 },
  { name: '_sysctl', x64: 156 },
  { name: 'sysfs', x64: 139 },
  { name: 'ustat', x64: 136 },
  { name: 'uselib', x64: 134 },
  { name: 'lookup_dcookie', x64: 212, arm64: 18 },
  // Direct access to I/O ports.
  { name: 'ioperm', x64: 173 },
  { name: 'iopl', x64: 172 },
  // Large kernel attack surface with frequent privilege-escalation bugs.
  { name: 'bpf', x64: 321, arm64: 280 },
  { name: 'perf_event_open', x64: 298, arm64: 241 },
  { name: 'userfaultfd', x64: 323, arm64: 282 },
  { name: 'io_uring_setup', x64: 425, arm64: 425 },
  { name: 'io_uring_enter', x64: 426, arm64: 426 },
  { name: 'io_uring_register', x64: 427, arm64: 427 },
  { name: 'fanotify_init', x64: 300, arm64: 262 },
  // File handles open files by inode, around the path checks of the mount tree.
  { name: 'name_to_handle_at', x64: 303, arm64: 264 },
  { name: 'open_by_handle_at', x64: 304, arm64: 265 },
  // Compares kernel objects of other processes: an information leak about kernel memory.
  { name: 'kcmp', x64: 312, arm64: 272 },
];

/** Syscalls the filter inspects more closely than allow/deny. */
const SYSCALL = {
  x64: { clone: 56, clone3: 435, ioctl: 16, personality: 135 },
  arm64: { clone: 220, clone3: 435, ioctl: 29, personality: 92 },
} as const;

/** AUDIT_ARCH_* values of linux/audit.h, as seccomp_data.arch reports them. */
const AUDIT_ARCH: Record<SeccompArch, number> = { x64: 0xc000003e, arm64: 0xc00000b7 };

const SECCOMP_RET_KILL_PROCESS = 0x80000000;
const SECCOMP_RET_ERRNO = 0x00050000;
const SECCOMP_RET_ALLOW = 0x7fff0000;
const EPERM = 1;
const ENOSYS = 38;

/** Offsets in `struct seccomp_data`; an argument's low 32 bits come first on little-endian. */
const NR = 0;
const ARCH = 4;
const argLow = (index: number) => 16 + 8 * index;

/** Syscalls numbered from here on x86_64 are the x32 ABI; -1 is "no syscall" (ptrace skips). */
const X32_SYSCALL_BIT = 0x40000000;
const NO_SYSCALL = 0xffffffff;

const CLONE_NAMESPACE_FLAGS =
  0x00000080 | // CLONE_NEWTIME
  0x00020000 | // CLONE_NEWNS
  0x02000000 | // CLONE_NEWCGROUP
  0x04000000 | // CLONE_NEWUTS
  0x08000000 | // CLONE_NEWIPC
  0x10000000 | // CLONE_NEWUSER
  0x20000000 | // CLONE_NEWPID
  0x40000000; // CLONE_NEWNET

/** Both push input into a terminal, which could reach a shell outside the sandbox. */
const TIOCSTI = 0x5412;
const TIOCLINUX = 0x541c;

/** Docker's: PER_LINUX, PER_LINUX32, UNAME26, UNAME26 | PER_LINUX32, and 0xffffffff (a query). */
const ALLOWED_PERSONALITIES = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff];

/**
 * Compiles the sandbox's seccomp filter: the raw `struct sock_filter` array that bubblewrap
 * installs with `--seccomp FD`. Another architecture is killed; {@link DENIED_SYSCALLS} fail
 * with EPERM; `clone3` fails with ENOSYS so libc falls back to `clone`, whose namespace flags
 * are refused; TIOCSTI/TIOCLINUX ioctls and unusual personalities fail with EPERM; the rest is
 * allowed. Throws for an architecture other than x64 and arm64.
 */
export function compileSeccompFilter(arch: SeccompArch = hostArch()): Buffer {
  const nr = SYSCALL[arch];
  const bpf = new BpfAssembler()
    .load(ARCH)
    .jeq(AUDIT_ARCH[arch], 'arch_ok')
    .ret(SECCOMP_RET_KILL_PROCESS)
    .label('arch_ok')
    .load(NR);

  if (arch === 'x64') {
    // The x32 ABI shares AUDIT_ARCH_X86_64 but numbers syscalls differently: deny it outright.
    bpf.jge(X32_SYSCALL_BIT, NEXT, 'native').jeq(NO_SYSCALL, 'native', 'eperm').label('native');
  }

  // One JEQ per syscall to a shared return; the assembler throws should the list ever grow past
  // the 255-instruction reach of a classic-BPF jump.
  for (const syscall of DENIED_SYSCALLS) {
    const number = syscall[arch];
    if (number !== undefined) bpf.jeq(number, 'eperm');
  }

  bpf
    .jeq(nr.clone3, 'enosys')
    .jeq(nr.clone, 'clone')
    .jeq(nr.ioctl, 'ioctl')
    .jeq(nr.personality, 'personality', 'allow');

  // The kernel reads clone flags, ioctl requests and personalities as 32-bit values, so the
  // high halves cannot smuggle anything past these checks.
  bpf.label('clone').load(argLow(0)).jset(CLONE_NAMESPACE_FLAGS, 'eperm', 'allow');

  bpf.label('ioctl').load(argLow(1)).jeq(TIOCSTI, 'eperm').jeq(TIOCLINUX, 'eperm', 'allow');

  bpf.label('personality').load(argLow(0));
  ALLOWED_PERSONALITIES.forEach((value, index) => {
    const last = index === ALLOWED_PERSONALITIES.length - 1;
    bpf.jeq(value, 'allow', last ? 'eperm' : NEXT);
  });

  bpf
    .label('allow')
    .ret(SECCOMP_RET_ALLOW)
    .label('eperm')
    .ret(SECCOMP_RET_ERRNO | EPERM)
    .label('enosys')
    .ret(SECCOMP_RET_ERRNO | ENOSYS);

  return encodeBpf(bpf.assemble());
}

function hostArch(): SeccompArch {
  const arch = process.arch;
  if (arch === 'x64' || arch === 'arm64') return arch;
  throw new Error(`No seccomp filter for architecture ${arch}`);
}
