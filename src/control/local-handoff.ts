/**
 * A local client's file, handed to the gateway by descriptor (issue 49, docs/envd-api.md "A
 * local file by descriptor"): a client on this host's loopback that holds a file open names it
 * as `X-Abx-Local-File: PID/FD` on a `PUT /files/write` or `GET /files/read` without a body, and
 * the gateway copies between that file and the sandbox's itself, at the disk's speed, instead of
 * the bytes crossing two sockets.
 *
 * The rule: the gateway only ever uses a descriptor that the requesting process itself holds,
 * in a mode that process holds it in. So it checks, in this order:
 * 1. the connection is on loopback and its client's socket is listed (/proc/net/tcp, peer-uid.ts);
 * 2. process PID holds that very socket (its /proc/PID/fd has `socket:[inode]`) and runs as the
 *    socket's uid: the requester is PID, not a process naming another one's file;
 * 3. it opens /proc/PID/fd/FD (a reopen of the same file) without blocking, and the result is a
 *    regular file;
 * 4. AFTER that open, /proc/PID/fdinfo/FD says the descriptor is open for reading (a download's:
 *    for writing, and not only appending), not `O_PATH` (which any user may open on a file it
 *    cannot read), and names the inode and mount the gateway opened: a descriptor swapped
 *    meanwhile is refused.
 * Any failure is {@link LocalFileUnavailableError}: the client sends the bytes instead.
 */
import {
  closeSync,
  constants,
  fstatSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
} from 'node:fs';
import { LOCAL_FILE_HEADER, LOCAL_FILE_UNAVAILABLE } from '../../runtime/protocol/constants.js';
import { InvalidArgumentError } from '../errors.js';
import { type ConnectionEnds, loopbackPeer } from './peer-uid.js';

export { LOCAL_FILE_HEADER };

const O_PATH = 0o10000000;
const O_APPEND = 0o2000;
const O_ACCMODE = 0o3;
const O_CLOEXEC = 0o2000000;

/** A refusal of a handoff: the message says why, `code` is {@link LOCAL_FILE_UNAVAILABLE}. */
export function localFileUnavailable(reason: string): InvalidArgumentError {
  return new InvalidArgumentError(
    `the gateway cannot use the client's file (${LOCAL_FILE_HEADER}): ${reason}; send its bytes in the request instead`,
    { code: LOCAL_FILE_UNAVAILABLE },
  );
}

/** `PID/FD` as two numbers, or a refusal. */
export function parseLocalFile(value: string): { pid: number; fd: number } {
  const match = /^(\d{1,9})\/(\d{1,9})$/.exec(value.trim());
  if (!match) throw localFileUnavailable(`${JSON.stringify(value.slice(0, 40))} is not PID/FD`);
  return { pid: Number(match[1]), fd: Number(match[2]) };
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // closed already
  }
}

/** A field of /proc/PID/fdinfo/FD (`flags` is octal there). */
function fdinfo(path: string): { flags: number; ino?: number; mnt?: number } {
  const text = readFileSync(path, 'utf8');
  const flags = /^flags:\s+([0-7]+)$/m.exec(text)?.[1];
  const ino = /^ino:\s+(\d+)$/m.exec(text)?.[1];
  const mnt = /^mnt_id:\s+(\d+)$/m.exec(text)?.[1];
  if (flags === undefined) throw new Error(`${path} has no flags`);
  return {
    flags: Number.parseInt(flags, 8),
    ...(ino === undefined ? {} : { ino: Number(ino) }),
    ...(mnt === undefined ? {} : { mnt: Number(mnt) }),
  };
}

/**
 * Opens the client's file named by `value` (`PID/FD`) for `use` (`read`: an upload reads it;
 * `write`: a download writes it), after the checks of the module's comment; the caller closes
 * the descriptor returned. Throws {@link localFileUnavailable} saying which check failed.
 */
export function openLocalFile(ends: ConnectionEnds, value: string, use: 'read' | 'write'): number {
  const { pid, fd } = parseLocalFile(value);
  const peer = loopbackPeer(ends);
  if (!peer)
    throw localFileUnavailable(
      'the request did not come from a process of this host over loopback',
    );
  let holds = false;
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const uids = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(status);
    if (!uids || Number(uids[1]) !== peer.uid || Number(uids[2]) !== peer.uid) {
      throw localFileUnavailable(`process ${pid} does not run as the connection's user`);
    }
    const socket = `socket:[${peer.inode}]`;
    for (const entry of readdirSync(`/proc/${pid}/fd`)) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${entry}`) === socket) {
          holds = true;
          break;
        }
      } catch {
        // closed meanwhile
      }
    }
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw error;
    throw localFileUnavailable(`process ${pid} cannot be looked at (${(error as Error).message})`);
  }
  if (!holds) throw localFileUnavailable(`process ${pid} does not hold this request's connection`);
  const mode = use === 'read' ? constants.O_RDONLY : constants.O_WRONLY;
  let opened: number;
  try {
    opened = openSync(
      `/proc/${pid}/fd/${fd}`,
      mode | constants.O_NONBLOCK | constants.O_NOCTTY | O_CLOEXEC,
    );
  } catch (error) {
    throw localFileUnavailable(
      `its descriptor ${fd} cannot be opened (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`,
    );
  }
  try {
    const s = fstatSync(opened);
    if (!s.isFile()) throw localFileUnavailable(`its descriptor ${fd} is not a regular file`);
    const theirs = fdinfo(`/proc/${pid}/fdinfo/${fd}`);
    const ours = fdinfo(`/proc/self/fdinfo/${opened}`);
    if ((theirs.flags & O_PATH) !== 0)
      throw localFileUnavailable(`its descriptor ${fd} is an O_PATH one`);
    const access = theirs.flags & O_ACCMODE;
    const allowed =
      use === 'read'
        ? access === constants.O_RDONLY || access === constants.O_RDWR
        : access === constants.O_WRONLY || access === constants.O_RDWR;
    // An append-only descriptor (a log a privileged process gave it) may not be written over.
    if (use === 'write' && (theirs.flags & O_APPEND) !== 0) {
      throw localFileUnavailable(`its descriptor ${fd} is open for appending only`);
    }
    if (!allowed) {
      throw localFileUnavailable(
        `its descriptor ${fd} is not open for ${use === 'read' ? 'reading' : 'writing'}`,
      );
    }
    if (theirs.ino !== s.ino || theirs.mnt === undefined || theirs.mnt !== ours.mnt) {
      throw localFileUnavailable(`its descriptor ${fd} changed while it was opened`);
    }
    return opened;
  } catch (error) {
    closeQuietly(opened);
    if (error instanceof InvalidArgumentError) throw error;
    throw localFileUnavailable(
      `its descriptor ${fd} cannot be checked (${(error as Error).message})`,
    );
  }
}
