import { createHash } from 'node:crypto';
import { readFile, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import { structuredPatch } from 'diff';
import { gitMode, linkedParent, openNoFollow } from './entry.js';
import { WorkspaceError } from './errors.js';
import { binaryLiteral, funcLine } from './git-format.js';
import { quotePath } from './quote-path.js';
import type { EntryState, WorkspaceChange, WorkspaceChanges } from './types.js';

/** Above this size (either side) a text file's patch is a `GIT binary patch` literal. */
export const DEFAULT_MAX_TEXT_DIFF_BYTES = 16 * 1024 * 1024;
/** How long one file's line diff may take before it becomes one whole-file hunk. */
export const DEFAULT_TEXT_DIFF_TIMEOUT_MS = 5000;

const NULL_OID = '0'.repeat(40);
const GIT_MODES = [0o644, 0o755];

/** Options of `diff()`. */
export interface DiffOptions {
  /** Lines of context around each change. Default 3, as git. */
  context?: number;
  /** See {@link DEFAULT_MAX_TEXT_DIFF_BYTES}. */
  maxTextBytes?: number;
  /** See {@link DEFAULT_TEXT_DIFF_TIMEOUT_MS}. */
  textTimeoutMs?: number;
}

/** One file of `--stat`: lines added and deleted, or a binary file's sizes. */
export interface DiffStatEntry {
  path: string;
  /** A rename's old path. */
  from?: string;
  added: number;
  deleted: number;
  binary: boolean;
  /** Binary files: the sizes before and after (0 when absent). */
  bytesBefore?: number;
  bytesAfter?: number;
}

/** Something of a change that a git patch cannot carry (so `complete` is false). */
export interface OmittedChange {
  path: string;
  reason: string;
}

/** The result of `diff()`: the patch and its `--stat` and `--name-only` forms as data. */
export interface WorkspaceDiff {
  /** The patch, bytes as git writes them (`git apply` accepts it). Empty when nothing changed. */
  patch: Buffer;
  /** `--stat`: one entry per changed path (a type change counts once). */
  stat: DiffStatEntry[];
  /** `--name-only`: the changed paths (the new path of a rename). */
  names: string[];
  /** False when some change is not in the patch: see `omitted`. */
  complete: boolean;
  /** FIFOs, sockets, devices, and mode bits git does not keep (set-id, group/other bits). */
  omitted: OmittedChange[];
}

/**
 * The unified diff of `changes` in git's format (as `git diff --binary --full-index` writes
 * it): `diff --git` headers, new/deleted/old/new mode lines, exact renames with
 * `similarity index 100%`, links as mode 120000 with the target as content, binary files as
 * `GIT binary patch` literals, paths quoted as core.quotePath does. Reads the contents from
 * the two folders and fails if one no longer matches what `changes()` recorded.
 */
export async function diff(
  changes: WorkspaceChanges,
  options: DiffOptions = {},
): Promise<WorkspaceDiff> {
  const ctx: Ctx = {
    changes,
    context: options.context ?? 3,
    maxTextBytes: options.maxTextBytes ?? DEFAULT_MAX_TEXT_DIFF_BYTES,
    timeout: options.textTimeoutMs ?? DEFAULT_TEXT_DIFF_TIMEOUT_MS,
    omitted: [],
  };
  const parts: Buffer[] = [];
  const stat: DiffStatEntry[] = [];
  for (const c of changes.entries) {
    const s: DiffStatEntry = {
      path: c.path,
      ...(c.from === undefined ? {} : { from: c.from }),
      added: 0,
      deleted: 0,
      binary: c.binary,
      ...(c.binary ? { bytesBefore: c.before?.size ?? 0, bytesAfter: c.after?.size ?? 0 } : {}),
    };
    if (c.status === 'typechange') {
      parts.push(await section(ctx, c, c.before, undefined, s));
      parts.push(await section(ctx, c, undefined, c.after, s));
    } else {
      parts.push(await section(ctx, c, c.before, c.after, s));
    }
    stat.push(s);
  }
  return {
    patch: Buffer.concat(parts),
    stat,
    names: changes.entries.map((c) => c.path),
    complete: ctx.omitted.length === 0,
    omitted: ctx.omitted,
  };
}

interface Ctx {
  changes: WorkspaceChanges;
  context: number;
  maxTextBytes: number;
  timeout: number;
  omitted: OmittedChange[];
}

function gitKeeps(s: EntryState | undefined): boolean {
  return s === undefined || s.kind === 'file' || s.kind === 'symlink';
}

async function section(
  ctx: Ctx,
  c: WorkspaceChange,
  before: EntryState | undefined,
  after: EntryState | undefined,
  s: DiffStatEntry,
): Promise<Buffer> {
  if (!gitKeeps(before) || !gitKeeps(after)) {
    const odd = gitKeeps(before) ? after : before;
    ctx.omitted.push({ path: c.path, reason: `a ${odd?.kind} cannot be in a git patch` });
    return Buffer.alloc(0);
  }
  const oldPath = c.from ?? c.path;
  const lines: string[] = [`diff --git ${quotePath('a/', oldPath)} ${quotePath('b/', c.path)}`];
  if (!before && after) lines.push(`new file mode ${gitMode(after)}`);
  else if (before && !after) lines.push(`deleted file mode ${gitMode(before)}`);
  else if (before && after) {
    if (gitMode(before) !== gitMode(after)) {
      lines.push(`old mode ${gitMode(before)}`, `new mode ${gitMode(after)}`);
    }
  }
  // git keeps the owner's x bit only, and writes 0644 or 0755.
  const modeShown =
    before === undefined || (after !== undefined && gitMode(before) !== gitMode(after));
  if (
    after?.kind === 'file' &&
    (before === undefined || c.modeChanged) &&
    (!modeShown || !GIT_MODES.includes(after.mode))
  ) {
    ctx.omitted.push({
      path: c.path,
      reason: `mode ${octal(after.mode)}${before ? ` (was ${octal(before.mode)})` : ''}: a git patch keeps only 0644 or 0755`,
    });
  }
  if (c.status === 'renamed') {
    lines.push(
      'similarity index 100%',
      `rename from ${quotePath('', c.from as string)}`,
      `rename to ${quotePath('', c.path)}`,
    );
  }
  const sameContent = before && after && before.sha256 === after.sha256;
  if (sameContent) {
    return lines.length > 1 ? Buffer.from(`${lines.join('\n')}\n`, 'latin1') : Buffer.alloc(0);
  }
  const oldOid = before?.oid ?? NULL_OID;
  const newOid = after?.oid ?? NULL_OID;
  const sameMode = before && after && gitMode(before) === gitMode(after);
  lines.push(`index ${oldOid}..${newOid}${sameMode ? ` ${gitMode(before)}` : ''}`);
  const oldBytes = before ? await content(ctx.changes.base, oldPath, before) : Buffer.alloc(0);
  const newBytes = after ? await content(ctx.changes.view, c.path, after) : Buffer.alloc(0);
  let body: string;
  if (
    before?.binary ||
    after?.binary ||
    oldBytes.length > ctx.maxTextBytes ||
    newBytes.length > ctx.maxTextBytes
  ) {
    body =
      oldBytes.length === 0 && newBytes.length === 0
        ? ''
        : `GIT binary patch\n${binaryLiteral(newBytes)}${binaryLiteral(oldBytes)}`;
  } else {
    body = textHunks(ctx, oldBytes.toString('latin1'), newBytes.toString('latin1'), s);
    if (body !== '') {
      const la = before ? quotePath('a/', oldPath) : '/dev/null';
      const lb = after ? quotePath('b/', c.path) : '/dev/null';
      body = `--- ${la}${la.includes(' ') ? '\t' : ''}\n+++ ${lb}${lb.includes(' ') ? '\t' : ''}\n${body}`;
    }
  }
  return Buffer.from(`${lines.join('\n')}\n${body}`, 'latin1');
}

function octal(mode: number): string {
  return mode.toString(8).padStart(4, '0');
}

async function content(root: string, path: string, state: EntryState): Promise<Buffer> {
  const full = join(root, path);
  const linked = await linkedParent(root, path);
  if (linked)
    throw new WorkspaceError(
      `${join(root, linked)} is not a folder: ${path} is not read through it`,
    );
  let bytes: Buffer;
  if (state.kind === 'symlink') bytes = await readlink(full, { encoding: 'buffer' });
  else {
    const fh = await openNoFollow(full);
    try {
      bytes = await readFile(fh);
    } finally {
      await fh.close();
    }
  }
  if (createHash('sha256').update(bytes).digest('hex') !== state.sha256) {
    throw new WorkspaceError(`${full} changed since changes() looked at it; call changes() again`);
  }
  return bytes;
}

function range(start: number, count: number): string {
  const first = count === 0 ? start - 1 : start;
  return count === 1 ? `${first}` : `${first},${count}`;
}

/** The hunks of a text file as git writes them, with git's default function-name context. */
function textHunks(ctx: Ctx, oldText: string, newText: string, s: DiffStatEntry): string {
  let patch = structuredPatch('', '', oldText, newText, '', '', {
    context: ctx.context,
    timeout: ctx.timeout,
  });
  if (patch === undefined) {
    // Too slow to diff line by line: one hunk that replaces the whole file.
    patch = {
      oldFileName: '',
      newFileName: '',
      oldHeader: '',
      newHeader: '',
      hunks: [wholeFileHunk(oldText, newText)],
    };
  }
  const oldLines = oldText.split('\n');
  let out = '';
  let func: string | undefined;
  let prevLimit = -1;
  for (const h of patch.hunks) {
    const s1 = h.oldStart - 1;
    for (let l = s1 - 1; l > prevLimit && l >= 0; l--) {
      const found = funcLine(oldLines[l]);
      if (found !== undefined) {
        func = found;
        break;
      }
    }
    prevLimit = s1 - 1;
    out += `@@ -${range(h.oldStart, h.oldLines)} +${range(h.newStart, h.newLines)} @@${func ? ` ${func}` : ''}\n`;
    for (const line of h.lines) {
      if (line.startsWith('+')) s.added++;
      else if (line.startsWith('-')) s.deleted++;
      out += `${line}\n`;
    }
  }
  return out;
}

function wholeFileHunk(oldText: string, newText: string) {
  const split = (t: string) => {
    if (t === '') return [];
    const ls = t.split('\n');
    const noEol = ls[ls.length - 1] !== '';
    if (!noEol) ls.pop();
    return ls.map((l, i) => ({ l, last: i === ls.length - 1 && noEol }));
  };
  const a = split(oldText);
  const b = split(newText);
  const lines: string[] = [];
  for (const x of a) lines.push(`-${x.l}`, ...(x.last ? ['\\ No newline at end of file'] : []));
  for (const x of b) lines.push(`+${x.l}`, ...(x.last ? ['\\ No newline at end of file'] : []));
  return { oldStart: 1, oldLines: a.length, newStart: 1, newLines: b.length, lines };
}
