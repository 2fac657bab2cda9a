import { create } from '@bufbuild/protobuf';
import { timestampFromDate } from '@bufbuild/protobuf/wkt';
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from '@connectrpc/connect';
import { type EnvdTarget, envdJson } from './envd-client.js';
import {
  type EntryInfo,
  EntryInfoSchema,
  type Filesystem as FilesystemService,
  FileType,
} from './gen/filesystem/filesystem_pb.js';
import { E2B_USER, userTarget } from './process-service.js';

/** A path as envd's `GET /files/stat` and `/files/list` describe it. */
export interface NativeEntry {
  name?: string;
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'other' | 'gone';
  size?: number;
  /** Permission bits in octal, `0755`. */
  mode?: string;
  mtime?: string;
  /** A symlink's destination, absolute. */
  target?: string;
  /** The file's user metadata (E2B's `X-Metadata-*`), when it has some. */
  metadata?: Record<string, string>;
}

/** ListDir walks at most this many entries (a depth over a large tree stays bounded). */
export const MAX_LIST_ENTRIES = 100_000;

const TYPES: Record<string, FileType> = {
  file: FileType.FILE,
  directory: FileType.DIRECTORY,
  symlink: FileType.SYMLINK,
};

/** Go's `FileMode.String()`, which E2B's envd sends as `permissions`: `drwxr-xr-x`. */
function permissionsOf(type: NativeEntry['type'], mode: number): string {
  const lead = type === 'directory' ? 'd' : type === 'symlink' ? 'L' : '-';
  let text = lead;
  for (let shift = 6; shift >= 0; shift -= 3) {
    const bits = (mode >> shift) & 7;
    text += `${bits & 4 ? 'r' : '-'}${bits & 2 ? 'w' : '-'}${bits & 1 ? 'x' : '-'}`;
  }
  return text;
}

export function entryOf(native: NativeEntry): EntryInfo {
  const mode = Number.parseInt(native.mode ?? '0', 8) || 0;
  const name = native.name ?? native.path.split('/').filter(Boolean).at(-1) ?? '/';
  return create(EntryInfoSchema, {
    name,
    type: TYPES[native.type] ?? FileType.UNSPECIFIED,
    path: native.path,
    size: BigInt(native.size ?? 0),
    mode: mode & 0o777,
    permissions: permissionsOf(native.type, mode),
    // Every file a sandbox's processes make is its one user's.
    owner: E2B_USER,
    group: E2B_USER,
    ...(native.mtime ? { modifiedTime: timestampFromDate(new Date(native.mtime)) } : {}),
    ...(native.target === undefined ? {} : { symlinkTarget: native.target }),
    ...(native.metadata ? { metadata: native.metadata } : {}),
  });
}

/** Paths by their components, each compared as bytes are (Go's WalkDir order). */
function comparePaths(a: string[], b: string[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const x = a[i] as string;
    const y = b[i] as string;
    if (x !== y) return x < y ? -1 : 1;
  }
  return a.length - b.length;
}

export function pathArg(value: string, field: string): string {
  if (value === '') {
    throw new ConnectError(`${field} is empty: name a path in the sandbox`, Code.InvalidArgument);
  }
  return value;
}

function stat(target: EnvdTarget, path: string, context: HandlerContext): Promise<NativeEntry> {
  return envdJson<NativeEntry>(
    target,
    'GET',
    `/files/stat?path=${encodeURIComponent(path)}`,
    undefined,
    context.signal,
  );
}

/** Whether a stat failed because nothing is there (anything else is passed on). */
function missing(error: unknown): boolean {
  return error instanceof ConnectError && error.code === Code.NotFound;
}

/** `filesystem.Filesystem` over envd's native FILE_OPS routes (the watches: watch-service.ts). */
export const filesystemService: Partial<ServiceImpl<typeof FilesystemService>> = {
  async stat(request, context) {
    const target = userTarget(context);
    return { entry: entryOf(await stat(target, pathArg(request.path, 'path'), context)) };
  },

  async listDir(request, context) {
    const target = userTarget(context);
    const root = pathArg(request.path, 'path');
    if (request.depth < 1) {
      throw new ConnectError(
        'depth must be at least 1 (1: the directory itself)',
        Code.InvalidArgument,
      );
    }
    const entries: EntryInfo[] = [];
    let level = [root];
    for (let depth = 1; depth <= request.depth && level.length > 0; depth++) {
      const next: string[] = [];
      for (const dir of level) {
        const listed = await envdJson<{ path: string; entries: NativeEntry[] }>(
          target,
          'GET',
          `/files/list?path=${encodeURIComponent(dir)}`,
          undefined,
          context.signal,
        ).catch((error: unknown) => {
          // A directory that went away meanwhile is skipped below the top.
          if (depth > 1 && missing(error)) return { path: dir, entries: [] };
          throw error;
        });
        for (const native of listed.entries) {
          if (native.type === 'gone') continue;
          entries.push(entryOf(native));
          if (native.type === 'directory') next.push(native.path);
          if (entries.length > MAX_LIST_ENTRIES) {
            throw new ConnectError(
              `${root} holds over ${MAX_LIST_ENTRIES} entries to depth ${request.depth}: list a smaller depth or a subdirectory`,
              Code.ResourceExhausted,
            );
          }
        }
      }
      level = next;
    }
    // E2B's envd walks the tree depth first, each directory's entries by name (Go's WalkDir):
    // the levels read here are put in that order.
    const parts = new Map(entries.map((entry) => [entry, entry.path.split('/')]));
    entries.sort((a, b) => comparePaths(parts.get(a) as string[], parts.get(b) as string[]));
    return { entries };
  },

  async makeDir(request, context) {
    const target = userTarget(context);
    const path = pathArg(request.path, 'path');
    const existing = await stat(target, path, context).catch((error: unknown) => {
      if (missing(error)) return undefined;
      throw error;
    });
    if (existing) {
      throw new ConnectError(
        `${existing.path} already exists (${existing.type})`,
        existing.type === 'directory' ? Code.AlreadyExists : Code.InvalidArgument,
      );
    }
    await envdJson(target, 'POST', '/files/mkdir', { path }, context.signal);
    return { entry: entryOf(await stat(target, path, context)) };
  },

  async move(request, context) {
    const target = userTarget(context);
    const source = pathArg(request.source, 'source');
    const destination = pathArg(request.destination, 'destination');
    target.audit?.('file.renamed', { from: source, to: destination });
    // E2B's envd renames over an existing file, as rename(2) does.
    await envdJson(
      target,
      'POST',
      '/files/move',
      { from: source, to: destination, overwrite: true },
      context.signal,
    );
    return { entry: entryOf(await stat(target, destination, context)) };
  },

  async remove(request, context) {
    const target = userTarget(context);
    const path = pathArg(request.path, 'path');
    target.audit?.('file.removed', { path, recursive: true });
    // As E2B's envd (Go's os.RemoveAll): a path that is not there is removed already.
    await envdJson(
      target,
      'POST',
      '/files/delete',
      { path, recursive: true },
      context.signal,
    ).catch((error: unknown) => {
      if (!missing(error)) throw error;
    });
    return {};
  },
};
