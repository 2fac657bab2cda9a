import { spawn } from 'node:child_process';
import { lchown, mkdir, stat } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { ARCHIVE_SIZE_HEADER } from '../protocol/constants.js';
import { FileOperationError, SandboxError, toolUnavailable } from '../server/errors.js';
import { fsAction, safePath } from '../server/file-system.js';
import { Reply } from '../server/http.js';
import { defineGroup } from '../server/route-group.js';
import { type Identity, identityFor, spawnIdentity } from '../server/users.js';
import { argList } from '../server/validate.js';
import { packTree, surveyTree } from './tar-pack.js';

/** tar's complaints kept for the error answer; more is rarely useful. */
const MAX_STDERR = 16 * 1024;

/**
 * Feeds `body` to the sandbox's own `tar -x` in `dest`. The archive comes from the client (the
 * host's `abx cp`), so the sandbox's tar is fine here: whatever it does stays in the sandbox.
 * Streamed from the request to tar's stdin, never through a file in the sandbox.
 */
async function unpack(dest: string, body: AsyncIterable<Buffer>, identity?: Identity) {
  // As another user (an image build's copy step), tar runs as that user and owns what it makes.
  const as = spawnIdentity(identity);
  const child = spawn('tar', ['-x', ...(identity ? ['-o'] : []), '-f', '-', '-C', dest], {
    cwd: dest,
    stdio: ['pipe', 'ignore', 'pipe'],
    ...(as.uid === undefined ? {} : { uid: as.uid, gid: as.gid }),
  });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => {
    if (stderr.length < MAX_STDERR) stderr += chunk.toString('utf8');
  });
  const exited = new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', resolve);
  });
  let size = 0;
  const counted = async function* () {
    for await (const chunk of body) {
      size += chunk.length;
      yield chunk;
    }
  };
  const fed = pipeline(counted, child.stdin).then(
    () => undefined,
    (error: Error) => error,
  );
  let code: number | null;
  try {
    code = await exited;
  } catch (error) {
    await fed;
    throw (error as NodeJS.ErrnoException).code === 'ENOENT'
      ? toolUnavailable('tar', 'unpacking an archive into the sandbox')
      : error;
  }
  const feedError = await fed;
  // The body's own failure (too large, too slow, the client gone) says more than tar's EOF.
  if (feedError instanceof SandboxError) throw feedError;
  if (code !== 0) {
    throw new FileOperationError(
      `tar could not unpack the archive into ${dest} (exit ${code}): ${stderr.trim() || 'no message'}`,
      { code: 'EIO' },
    );
  }
  // Past that, tar read a whole archive: it stops at the end-of-archive blocks, so the padding
  // after them may meet a closed pipe (EPIPE, premature close), which is no failure.
  return { path: dest, size };
}

/**
 * Directory trees in one stream each way. Out: a tar archive envd packs itself (only
 * directories, regular files and symbolic links), piped to the answer as it is made. In: a tar
 * body piped into the sandbox's `tar -x`. Neither goes through a temporary file, so nothing else
 * in the sandbox can swap the archive on its way.
 */
export const ARCHIVE = defineGroup('ARCHIVE', '/files/archive', 'directory trees as tar streams', [
  {
    method: 'GET',
    path: '/files/archive',
    summary:
      'Streams the tree under a directory as a tar archive packed by envd: directories, files, symlinks.',
    args: argList({
      path: 'str',
      'one_file_system?': [
        'bool',
        false,
        "stay on the directory's own file system: a folder mounted below it (a volume, a workspace) is listed, empty (as tar --one-file-system)",
      ],
    }),
    handler: async ({ args }) => {
      const root = safePath(args.path as string);
      const oneFs = args.one_file_system === true;
      const stats = await fsAction(`archive ${root}`, () => stat(root));
      if (!stats.isDirectory()) {
        throw new FileOperationError(
          `${root} is not a directory; read a file with GET /files/read`,
          { code: 'ENOTDIR' },
        );
      }
      const size = await surveyTree(root, stats, oneFs);
      return new Reply(200, Readable.from(packTree(root, stats, oneFs), { objectMode: false }), {
        'content-type': 'application/x-tar',
        'cache-control': 'no-store',
        [ARCHIVE_SIZE_HEADER]: String(size),
      });
    },
  },
  {
    method: 'PUT',
    path: '/files/archive',
    summary:
      'Unpacks the raw tar body into the directory `?path=` (created if missing) with the sandbox’s `tar`.',
    body: 'stream',
    args: argList({ path: 'str', 'user?': 'str' }),
    handler: async ({ args, stream }) => {
      const dest = safePath(args.path as string);
      const identity = identityFor(args.user as string | undefined);
      await fsAction(`create directory ${dest}`, () => mkdir(dest, { recursive: true }));
      if (identity) await fsAction(`chown ${dest}`, () => lchown(dest, identity.uid, identity.gid));
      return unpack(dest, stream(), identity);
    },
  },
]);
