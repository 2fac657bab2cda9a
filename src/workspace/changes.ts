import type { Stats } from 'node:fs';
import { readdir, realpath } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { entryState, kindOf, lstatOrNull, lstatOrNullSync, sameContent } from './entry.js';
import { WorkspaceError } from './errors.js';
import type { ChangesOptions, EntryState, WorkspaceChange, WorkspaceChanges } from './types.js';

interface Walk {
  base: string;
  view: string;
  upper?: string;
  includeGit: boolean;
  out: WorkspaceChange[];
}

/** `/proc/PID/root/…`: a path in the mount namespace of process PID. */
const PROCESS_ROOT = /^\/proc\/\d+\/root\//;

/**
 * Lists what differs between `base` (the host folder, the overlay's lower layer) and `view`
 * (the sandbox's view of it: the merged overlay, or any folder).
 *
 * Never follows a link (lstat everywhere; a link's target is compared as text). Files are
 * compared by size, then by content only when the sizes match (an overlay copy-up keeps the
 * mtime, so times prove nothing); hashes are taken only of what differs. Without `upper`,
 * both trees are walked whole; with it, only the upper layer is (see {@link ChangesOptions}).
 * `.git` is left out unless `includeGit`. A deleted and an added file with identical content
 * are one rename (see docs/workspaces.md for the pairing rule).
 */
export async function changes(
  base: string,
  view: string,
  options: ChangesOptions = {},
): Promise<WorkspaceChanges> {
  // The roots are the caller's own choice: a root given through a link is followed (once,
  // here); below them nothing is.
  const root = async (what: string, dir: string) => {
    // A folder of another mount namespace, reached through a process's root, as given: realpath
    // would name the path in this process's own namespace instead (a rootless sandbox's view).
    const real = PROCESS_ROOT.test(dir)
      ? resolve(dir)
      : await realpath(resolve(dir)).catch(() => undefined);
    const st = real === undefined ? null : await lstatOrNull(real);
    if (real === undefined || !st?.isDirectory()) {
      throw new WorkspaceError(`the ${what} folder ${dir} is not a directory`);
    }
    return real;
  };
  const w: Walk = {
    base: await root('base', base),
    view: await root('view', view),
    upper: options.upper === undefined ? undefined : await root('upper', options.upper),
    includeGit: options.includeGit === true,
    out: [],
  };
  if (w.upper === undefined) await compareDir(w, '');
  else await compareUpperDir(w, '');
  return { base: w.base, view: w.view, entries: pairRenames(w.out.sort(byPath)).sort(byPath) };
}

function byPath(a: WorkspaceChange, b: WorkspaceChange): number {
  return Buffer.compare(Buffer.from(a.path), Buffer.from(b.path));
}

function rel(dir: string, name: string): string {
  return dir === '' ? name : `${dir}/${name}`;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

async function listDir(path: string): Promise<Set<string>> {
  const names = new Set<string>();
  for (const raw of await readdir(path, { encoding: 'buffer' })) {
    try {
      names.add(utf8.decode(raw));
    } catch {
      // A name that is not UTF-8 could not be named in a change: fail rather than miss it.
      throw new WorkspaceError(
        `${join(path, raw.toString('latin1'))}: a file name that is not UTF-8 is not supported`,
      );
    }
  }
  return names;
}

function sortedUnion(...sets: Set<string>[]): string[] {
  const all = new Set<string>();
  for (const s of sets) for (const n of s) all.add(n);
  return [...all].sort(byName);
}

/** How many entries of one folder are compared at once (each holds at most two open files). */
const PARALLEL = 32;

async function eachLimited<T>(items: T[], fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await fn(items[next++]);
  };
  await Promise.all(Array.from({ length: Math.min(PARALLEL, items.length) }, worker));
}

/**
 * Compares a folder on both sides: its entries at most {@link PARALLEL} at a time, then its
 * subfolders one after the other (depth first), so that only the names of the folders on the
 * way down are held.
 */
async function compareDir(w: Walk, dir: string): Promise<void> {
  const [b, v] = await Promise.all([listDir(join(w.base, dir)), listDir(join(w.view, dir))]);
  const names = sortedUnion(b, v).filter((name) => name !== '.git' || w.includeGit);
  const subdirs: string[] = [];
  await eachLimited(names, async (name) => {
    const path = rel(dir, name);
    const [bs, vs] = statBoth(w, path);
    if (bs?.isDirectory() && vs?.isDirectory()) subdirs.push(path);
    else await compareStats(w, path, bs, vs);
  });
  for (const path of subdirs.sort(byName)) await compareDir(w, path);
}

function byName(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

function statBoth(w: Walk, path: string): [Stats | null, Stats | null] {
  return [lstatOrNullSync(join(w.base, path)), lstatOrNullSync(join(w.view, path))];
}

/** Compares one path on both sides in full (recursing into directories on both sides). */
async function comparePath(w: Walk, path: string, recurse = compareDir): Promise<void> {
  const [bs, vs] = statBoth(w, path);
  if (bs?.isDirectory() && vs?.isDirectory()) return recurse(w, path);
  await compareStats(w, path, bs, vs);
}

/** One path where at most one side is a folder. */
async function compareStats(
  w: Walk,
  path: string,
  bs: Stats | null,
  vs: Stats | null,
): Promise<void> {
  if (bs?.isDirectory()) await emitTree(w, path, 'deleted');
  if (vs?.isDirectory()) await emitTree(w, path, 'added');
  const bNon = bs && !bs.isDirectory() ? bs : null;
  const vNon = vs && !vs.isDirectory() ? vs : null;
  if (bNon && vNon) await compareEntries(w, path, bNon, vNon);
  else if (bNon) w.out.push(removed(path, await entryState(join(w.base, path), bNon)));
  else if (vNon) w.out.push(created(path, await entryState(join(w.view, path), vNon)));
}

/** Every non-directory under `path` on one side, as added (view) or deleted (base). */
async function emitTree(w: Walk, path: string, status: 'added' | 'deleted'): Promise<void> {
  const root = status === 'added' ? w.view : w.base;
  const names = sortedUnion(await listDir(join(root, path))).filter(
    (name) => name !== '.git' || w.includeGit,
  );
  const subdirs: string[] = [];
  await eachLimited(names, async (name) => {
    const p = rel(path, name);
    const st = await lstatOrNull(join(root, p));
    if (!st) return;
    if (st.isDirectory()) subdirs.push(p);
    else {
      const state = await entryState(join(root, p), st);
      w.out.push(status === 'added' ? created(p, state) : removed(p, state));
    }
  });
  for (const p of subdirs.sort(byName)) await emitTree(w, p, status);
}

function created(path: string, after: EntryState): WorkspaceChange {
  return {
    status: 'added',
    path,
    after,
    contentChanged: true,
    modeChanged: false,
    binary: after.binary === true,
  };
}

function removed(path: string, before: EntryState): WorkspaceChange {
  return {
    status: 'deleted',
    path,
    before,
    contentChanged: true,
    modeChanged: false,
    binary: before.binary === true,
  };
}

async function compareEntries(w: Walk, path: string, bs: Stats, vs: Stats): Promise<void> {
  const bPath = join(w.base, path);
  const vPath = join(w.view, path);
  const bKind = kindOf(bs);
  const vKind = kindOf(vs);
  const modeChanged =
    bKind === 'file' && vKind === 'file' && (bs.mode & 0o7777) !== (vs.mode & 0o7777);
  if (bKind === vKind) {
    if (bKind === 'file') {
      const same = bs.size === vs.size && (await sameContent(bPath, vPath, bs.size));
      if (same && !modeChanged) return;
    } else if (bKind === 'symlink') {
      // entryState reads both targets; equal hashes are no change.
    } else if (bKind === 'char-device' || bKind === 'block-device') {
      if (bs.rdev === vs.rdev && (bs.mode & 0o7777) === (vs.mode & 0o7777)) return;
    } else if ((bs.mode & 0o7777) === (vs.mode & 0o7777)) {
      return;
    }
  }
  const [before, after] = await Promise.all([entryState(bPath, bs), entryState(vPath, vs)]);
  if (bKind === 'symlink' && vKind === 'symlink' && before.sha256 === after.sha256) return;
  const contentChanged = bKind !== vKind || before.sha256 !== after.sha256;
  w.out.push({
    status: bKind === vKind ? 'modified' : 'typechange',
    path,
    before,
    after,
    contentChanged: contentChanged || bKind !== vKind,
    modeChanged,
    binary: before.binary === true || after.binary === true,
  });
}

function isWhiteout(st: Stats): boolean {
  return st.isCharacterDevice() && st.rdev === 0;
}

/**
 * Walks a directory present in the upper layer (and a directory in both base and view).
 * A name in the upper is compared in full; a name only in the base (or only in the view, as a
 * redirected directory brings) is compared in full too; a name in base and view but not in
 * the upper comes from the lower layer unchanged.
 */
async function compareUpperDir(w: Walk, dir: string): Promise<void> {
  const upper = w.upper as string;
  const [u, v, b] = await Promise.all([
    listDir(join(upper, dir)),
    listDir(join(w.view, dir)),
    listDir(join(w.base, dir)),
  ]);
  for (const name of sortedUnion(u, v, b)) {
    if (name === '.git' && !w.includeGit) continue;
    const path = rel(dir, name);
    if (u.has(name)) {
      const us = await lstatOrNull(join(upper, path));
      if (us?.isDirectory()) await comparePath(w, path, compareUpperDir);
      else if (us && isWhiteout(us) && !b.has(name)) continue;
      else await comparePath(w, path);
    } else if (v.has(name) !== b.has(name)) {
      await comparePath(w, path);
    } else if (v.has(name) && (await notFromBase(w, path))) {
      await comparePath(w, path);
    }
  }
}

/**
 * Whether a name in the view that the upper layer lacks is not the base's own entry: a
 * redirected directory (overlay's redirect_dir) shows another lower folder's files under a
 * name the base may also have. A lower file keeps its inode number in the view, so a file
 * whose number differs is compared in full (as is one whose kind differs). Directories are
 * taken as the base's (their numbers are not kept on every setup): see docs/workspaces.md.
 */
async function notFromBase(w: Walk, path: string): Promise<boolean> {
  const [bs, vs] = await Promise.all([
    lstatOrNull(join(w.base, path)),
    lstatOrNull(join(w.view, path)),
  ]);
  if (!bs || !vs) return true;
  if (bs.isDirectory() !== vs.isDirectory()) return true;
  return !bs.isDirectory() && bs.ino !== vs.ino;
}

/**
 * Pairs deleted and added entries of the same kind (files, links) and identical content as
 * renames: a pair with the same base name first, then in path order. The pair keeps the
 * added side's mode (a rename with a mode change).
 */
function pairRenames(list: WorkspaceChange[]): WorkspaceChange[] {
  const deleted = new Map<string, WorkspaceChange[]>();
  for (const c of list) {
    if (c.status !== 'deleted' || !c.before?.sha256) continue;
    const key = `${c.before.kind}:${c.before.sha256}`;
    deleted.set(key, [...(deleted.get(key) ?? []), c]);
  }
  if (deleted.size === 0) return list;
  const gone = new Set<WorkspaceChange>();
  const out: WorkspaceChange[] = [];
  const added = list.filter((c) => c.status === 'added' && c.after?.sha256).sort(byPath);
  const baseName = (p: string) => p.slice(p.lastIndexOf('/') + 1);
  for (const a of added) {
    const after = a.after as EntryState;
    const candidates = (deleted.get(`${after.kind}:${after.sha256}`) ?? []).filter(
      (d) => !gone.has(d),
    );
    if (candidates.length === 0) continue;
    const d = candidates.find((c) => baseName(c.path) === baseName(a.path)) ?? candidates[0];
    gone.add(d);
    gone.add(a);
    const before = d.before as EntryState;
    out.push({
      status: 'renamed',
      path: a.path,
      from: d.path,
      before,
      after,
      contentChanged: false,
      modeChanged: before.kind === 'file' && before.mode !== after.mode,
      binary: after.binary === true,
    });
  }
  return [...list.filter((c) => !gone.has(c)), ...out];
}
