import { createHash } from 'node:crypto';
import { constants, type Stats } from 'node:fs';
import { chown, lchown, mkdir, open, opendir, rmdir, symlink, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { APPLY_TEMP_PREFIX, ApplyJournal } from './apply-journal.js';
import { entryState, kindOf, linkedParent, lstatOrNull, openNoFollow } from './entry.js';
import { type Refusal, WorkspaceRefusedError, WorkspaceWriteError } from './errors.js';
import type { EntryState, WorkspaceChange, WorkspaceChanges } from './types.js';

/** The largest file `apply()` writes unless told otherwise: 100 MiB. */
export const DEFAULT_MAX_FILE_BYTES = 100 * 1024 * 1024;

/** Options of `apply()`. */
export interface ApplyOptions {
  /**
   * When the workspace was created (the sandbox started): a base entry changed after it
   * (mtime or ctime) is a conflict.
   */
  since: Date | number;
  /** Apply only these changes: a path (either path of a rename) or a folder above paths. */
  paths?: string[];
  /** Validate everything, write nothing; the result lists what would be applied. */
  dryRun?: boolean;
  /** Write over conflicts (host changes since `since`). Never lifts the other refusals. */
  force?: boolean;
  /** The largest file written; larger ones are refused. Default {@link DEFAULT_MAX_FILE_BYTES}. */
  maxFileBytes?: number;
  /** Allow paths inside `.git` folders (refused by default, as `changes()` leaves them out). */
  includeGit?: boolean;
}

/** What `apply()` did (or, with `dryRun`, would do). */
export interface ApplyResult {
  dryRun: boolean;
  /** The changes applied, in the order written. */
  applied: WorkspaceChange[];
  /** Conflicts written over because of `force`. */
  forced: Refusal[];
}

interface Plan {
  base: string;
  view: string;
  chosen: WorkspaceChange[];
  /** Base paths that this apply removes (deletions and rename sources). */
  removing: Set<string>;
  refusals: Refusal[];
  conflicts: Refusal[];
  since: number;
  max: number;
  includeGit: boolean;
}

/**
 * Writes the chosen changes into the base folder (`changes.base`), reading new content from
 * the view (`changes.view`). Everything is validated first (each path named in a
 * {@link WorkspaceRefusedError}, nothing written); then deletions, renames, and writes, each
 * file through a temporary file in its own folder renamed over the old (atomic), with its mode
 * (set-id bits never). A failure while writing is a {@link WorkspaceWriteError} listing what
 * was written. Refused always: links whose target leaves the base (or is absolute, or goes
 * through a link), FIFOs, sockets, devices, set-uid/set-gid files, paths that climb (`..`,
 * absolute, through a link in the base), files over `maxFileBytes`, content that changed in
 * the view since `changes()`. Refused unless `force`: host changes since `since`.
 */
export async function apply(
  changes: WorkspaceChanges,
  options: ApplyOptions,
): Promise<ApplyResult> {
  const since = options.since instanceof Date ? options.since.getTime() : options.since;
  if (typeof since !== 'number' || !Number.isFinite(since)) {
    throw new WorkspaceRefusedError([
      { path: '.', reason: 'since must be a Date or epoch milliseconds' },
    ]);
  }
  const max = options.maxFileBytes ?? DEFAULT_MAX_FILE_BYTES;
  if (!Number.isSafeInteger(max) || max < 0) {
    throw new WorkspaceRefusedError([
      { path: '.', reason: 'maxFileBytes must be a whole number of bytes, 0 or more' },
    ]);
  }
  const plan: Plan = {
    base: changes.base,
    view: changes.view,
    chosen: choose(changes.entries, options.paths),
    removing: new Set(),
    refusals: [],
    conflicts: [],
    since,
    max,
    includeGit: options.includeGit === true,
  };
  for (const p of options.paths ?? []) {
    if (!changes.entries.some((c) => matches(c, p)))
      plan.refusals.push({ path: p, reason: 'no change at this path' });
  }
  for (const c of plan.chosen) {
    if (c.status === 'deleted') plan.removing.add(c.path);
    if (c.status === 'renamed' && c.from !== undefined) plan.removing.add(c.from);
  }
  for (const c of plan.chosen) await validate(plan, c);
  await findLeftovers(plan);
  const refusals = [...plan.refusals, ...(options.force ? [] : plan.conflicts)];
  if (refusals.length > 0) throw new WorkspaceRefusedError(refusals);
  const forced = options.force ? plan.conflicts : [];
  if (options.dryRun) return { dryRun: true, applied: plan.chosen, forced };
  return { dryRun: false, applied: await write(plan), forced };
}

/**
 * Refuses the apply while a folder it writes holds a temporary file or backup of an apply that
 * was killed midway (or runs now): a backup is the only copy of what that apply replaced. And
 * never writes such a name itself.
 */
async function findLeftovers(plan: Plan): Promise<void> {
  const folders = new Set<string>();
  // Only folders of paths found sound (no climbing, no link on the way).
  const refused = new Set(plan.refusals.map((r) => r.path));
  for (const c of plan.chosen) {
    if (refused.has(c.path) || (c.from !== undefined && refused.has(c.from))) continue;
    for (const p of c.from === undefined ? [c.path] : [c.from, c.path]) {
      const parts = p.split('/');
      if (parts.at(-1)?.startsWith(APPLY_TEMP_PREFIX)) {
        plan.refusals.push({ path: p, reason: `${APPLY_TEMP_PREFIX}* names are apply's own` });
      }
      folders.add(parts.slice(0, -1).join('/'));
    }
  }
  for (const folder of [...folders].sort()) {
    const st = await lstatOrNull(join(plan.base, folder));
    if (!st?.isDirectory()) continue;
    for await (const d of await opendir(join(plan.base, folder))) {
      if (!d.name.startsWith(APPLY_TEMP_PREFIX)) continue;
      const bak = /^\.abx-apply-[0-9a-f]{12}\.(.+)\.bak$/s.exec(d.name);
      plan.refusals.push({
        path: folder === '' ? d.name : `${folder}/${d.name}`,
        reason: bak
          ? `an apply that was killed midway (or runs now) set the old ${bak[1]} aside here: rename it back over ${bak[1]}, or remove it, then apply again`
          : 'a temporary file of an apply that was killed midway (or runs now): remove it, then apply again',
      });
    }
  }
}

function matches(c: WorkspaceChange, p: string): boolean {
  const q = p.replace(/\/+$/, '');
  return [c.path, c.from].some((x) => x !== undefined && (x === q || x.startsWith(`${q}/`)));
}

function choose(entries: WorkspaceChange[], paths: string[] | undefined): WorkspaceChange[] {
  if (paths === undefined) return [...entries];
  return entries.filter((c) => paths.some((p) => matches(c, p)));
}

/** A relative path of names: no empty, `.` or `..` component, not absolute, no NUL. */
function pathProblem(path: string, includeGit: boolean): string | undefined {
  if (path === '' || path.startsWith('/')) return 'not a relative path';
  if (path.includes('\0')) return 'contains a NUL byte';
  const parts = path.split('/');
  if (parts.some((p) => p === '' || p === '.' || p === '..'))
    return 'climbs or has an empty component (`..`, `.`, `//`)';
  if (!includeGit && parts.includes('.git')) return 'inside a .git folder';
  return undefined;
}

/** Which sides each kind of change has. */
const SHAPES: Record<string, { before: boolean; after: boolean; from: boolean }> = {
  added: { before: false, after: true, from: false },
  deleted: { before: true, after: false, from: false },
  modified: { before: true, after: true, from: false },
  typechange: { before: true, after: true, from: false },
  renamed: { before: true, after: true, from: true },
};

async function validate(plan: Plan, c: WorkspaceChange): Promise<void> {
  const refuse = (reason: string, path = c.path) => plan.refusals.push({ path, reason });
  const conflict = (reason: string, path = c.path) => plan.conflicts.push({ path, reason });
  const shape = SHAPES[c.status];
  if (
    !shape ||
    shape.before !== !!c.before ||
    shape.after !== !!c.after ||
    shape.from !== (c.from !== undefined)
  ) {
    return void refuse(
      `not a change changes() makes (status ${JSON.stringify(c.status)} with these sides)`,
    );
  }
  for (const p of c.from === undefined ? [c.path] : [c.from, c.path]) {
    const problem = pathProblem(p, plan.includeGit);
    if (problem) return void refuse(problem, p);
  }
  for (const p of c.from === undefined ? [c.path] : [c.from, c.path]) {
    const problem = await parentProblem(plan, p);
    if (problem) return void refuse(problem, p);
  }
  const after = c.after;
  if (after) {
    const linked = await linkedParent(plan.view, c.path);
    if (linked) return void refuse(`${linked} in the sandbox is not a folder`);
    if (after.kind !== 'file' && after.kind !== 'symlink')
      return void refuse(`a ${after.kind} is never applied`);
    if (after.kind === 'file' && after.mode & 0o6000) {
      return void refuse(`set-uid/set-gid bits (mode ${after.mode.toString(8)}) are never applied`);
    }
    if (after.size > plan.max)
      return void refuse(`${after.size} bytes, over the limit of ${plan.max}`);
    if (after.kind === 'symlink') {
      const problem = await targetProblem(plan, c.path, after.target ?? '');
      if (problem) return void refuse(problem);
    }
    // The view must still hold what was reviewed.
    const vs = await lstatOrNull(join(plan.view, c.path));
    const now = vs && !vs.isDirectory() ? await entryState(join(plan.view, c.path), vs) : undefined;
    if (!now || now.kind !== after.kind || now.sha256 !== after.sha256 || now.mode !== after.mode) {
      return void refuse('changed in the sandbox since changes(); review it again');
    }
  }
  // What the base holds now against what the change expects to replace.
  const beforePath = c.from ?? c.path;
  const bs = await lstatOrNull(join(plan.base, beforePath));
  if (c.before) {
    const reason = await baseConflict(plan, beforePath, bs, c.before);
    if (reason) conflict(reason, beforePath);
  }
  if (c.status === 'added' || c.status === 'renamed') {
    const ts = c.status === 'added' ? bs : await lstatOrNull(join(plan.base, c.path));
    if (ts?.isDirectory()) {
      const left = await keptUnder(plan, c.path);
      if (left) refuse(`a folder in the base that keeps ${left}`);
    } else if (ts) conflict('created on the host since the workspace was made');
  }
}

async function baseConflict(
  plan: Plan,
  path: string,
  st: Stats | null,
  before: EntryState,
): Promise<string | undefined> {
  if (!st) return 'deleted on the host since the workspace was made';
  if (kindOf(st) !== before.kind) return 'replaced on the host since the workspace was made';
  if (st.mtimeMs > plan.since || st.ctimeMs > plan.since) {
    return 'changed on the host after the workspace was made';
  }
  if (before.kind === 'file' || before.kind === 'symlink') {
    const now = await entryState(join(plan.base, path), st);
    if (now.sha256 !== before.sha256)
      return 'its content on the host is not what the change replaces';
  }
  if ((st.mode & 0o7777) !== before.mode) return 'its mode changed on the host';
  return undefined;
}

/** The first entry under a base folder that this apply does not remove, if any. */
async function keptUnder(plan: Plan, path: string): Promise<string | undefined> {
  const dir = await opendir(join(plan.base, path));
  for await (const d of dir) {
    const p = `${path}/${d.name}`;
    if (d.isDirectory()) {
      const left = await keptUnder(plan, p);
      if (left) return left;
    } else if (!plan.removing.has(p)) return p;
  }
  return undefined;
}

/** Each parent in the base must be a folder (not a link), or absent, or a file removed here. */
async function parentProblem(plan: Plan, path: string): Promise<string | undefined> {
  const parts = path.split('/');
  for (let i = 1; i < parts.length; i++) {
    const prefix = parts.slice(0, i).join('/');
    const st = await lstatOrNull(join(plan.base, prefix));
    if (!st) return undefined;
    if (st.isSymbolicLink()) return `climbs through the link ${prefix} in the base`;
    if (!st.isDirectory() && !plan.removing.has(prefix))
      return `${prefix} in the base is not a folder`;
    if (!st.isDirectory()) return undefined;
  }
  return undefined;
}

/**
 * A link's target must stay inside the base as written: relative, `..` only at its start and
 * no higher than the base, and no name along it a link (in the base or the view), so no chain
 * of links can lead out.
 */
async function targetProblem(
  plan: Plan,
  path: string,
  target: string,
): Promise<string | undefined> {
  const out = `links outside the folder (${JSON.stringify(target)})`;
  if (target === '' || target.startsWith('/')) return out;
  const parts = target.split('/').filter((p) => p !== '' && p !== '.');
  const dir = path.split('/').slice(0, -1);
  let i = 0;
  while (i < parts.length && parts[i] === '..') {
    if (dir.length === 0) return out;
    dir.pop();
    i++;
  }
  const rest = parts.slice(i);
  if (rest.includes('..')) return `${out}: \`..\` after a name is not applied`;
  for (let k = 0; k < rest.length; k++) {
    const prefix = [...dir, ...rest.slice(0, k + 1)].join('/');
    for (const root of [plan.base, plan.view]) {
      const st = await lstatOrNull(join(root, prefix));
      if (st?.isSymbolicLink()) return `${out}: it goes through the link ${prefix}`;
    }
  }
  return undefined;
}

const isRoot = () => process.getuid?.() === 0;

/** Whether a change's new content is copied from the view (not a rename or chmod in the base). */
function fromView(plan: Plan, c: WorkspaceChange): boolean {
  if (c.status === 'deleted') return false;
  // A conflict written over (force): the base no longer holds the recorded "before", so the
  // new content comes from the view rather than from moving or chmod-ing the base's entry.
  if (plan.conflicts.some((r) => r.path === (c.from ?? c.path))) return true;
  if (c.status === 'renamed') return false;
  return !(c.status === 'modified' && !c.contentChanged);
}

/**
 * Writes in two passes through an undo journal: first every new content into a temporary file
 * next to its path (folders made as needed), touching nothing that exists; then deletions,
 * renames and the rest, each old entry kept under a backup name. A failure in either undoes
 * everything done, in reverse; success removes the backups, then the folders emptied.
 */
async function write(plan: Plan): Promise<WorkspaceChange[]> {
  const written: WorkspaceChange[] = [];
  const order = [
    ...plan.chosen.filter((c) => c.status === 'deleted'),
    ...plan.chosen.filter((c) => c.status === 'renamed'),
    ...plan.chosen.filter((c) => c.status !== 'deleted' && c.status !== 'renamed'),
  ];
  const journal = new ApplyJournal(plan.base);
  const staged = new Map<WorkspaceChange, string>();
  let at = order[0];
  try {
    for (const c of order) {
      at = c;
      // A path under a file this apply removes is staged once that file is gone.
      if (fromView(plan, c) && (await parentsAreFolders(plan, c.path))) {
        staged.set(c, await stage(plan, c, journal));
      }
    }
    for (const c of order) {
      at = c;
      await commit(plan, c, staged.get(c), journal);
      written.push(c);
    }
  } catch (err) {
    const undo = await journal.rollback();
    const restored = undo.notRestored.length === 0;
    throw new WorkspaceWriteError(
      at?.path ?? '.',
      restored ? [] : written.map((c) => c.path),
      err,
      { rolledBack: restored, ...undo },
    );
  }
  await journal.finish();
  for (const c of written) {
    if (c.status === 'deleted') await prune(plan, c.path);
    if (c.status === 'renamed') await prune(plan, c.from as string);
  }
  return written;
}

/** Whether every existing parent of `path` in the base is a folder. */
async function parentsAreFolders(plan: Plan, path: string): Promise<boolean> {
  const parts = path.split('/').slice(0, -1);
  for (let i = 1; i <= parts.length; i++) {
    const st = await lstatOrNull(join(plan.base, ...parts.slice(0, i)));
    if (!st) return true;
    if (!st.isDirectory()) return false;
  }
  return true;
}

/** Copies the view's entry into a new temporary file (or link) in its folder; recorded. */
async function stage(plan: Plan, c: WorkspaceChange, journal: ApplyJournal): Promise<string> {
  await makeParents(plan, c.path, journal);
  const after = c.after as EntryState;
  const owner = await ownerFor(plan, c.path);
  const tmp = ApplyJournal.tempIn(join(plan.base, ...c.path.split('/').slice(0, -1)));
  try {
    if (after.kind === 'symlink') {
      await symlink(after.target as string, tmp);
      if (owner) await lchown(tmp, owner.uid, owner.gid);
    } else {
      await copyVerified(join(plan.view, c.path), tmp, after, owner);
    }
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw err;
  }
  journal.made(tmp);
  return tmp;
}

/** Puts one change in place: each old entry it replaces, deletes or renames away kept aside. */
async function commit(
  plan: Plan,
  c: WorkspaceChange,
  staged: string | undefined,
  journal: ApplyJournal,
): Promise<void> {
  const target = join(plan.base, c.path);
  if (c.status === 'deleted') {
    const st = await lstatOrNull(target);
    if (st?.isDirectory()) throw new Error(`${c.path} is a folder on the host`);
    if (st) await journal.setAside(target);
    return;
  }
  const after = c.after as EntryState;
  if (fromView(plan, c)) {
    await journal.replace(staged ?? (await stage(plan, c, journal)), target);
    if (c.status === 'renamed') {
      const from = join(plan.base, c.from as string);
      if (await lstatOrNull(from)) await journal.setAside(from);
    }
    return;
  }
  if (c.status === 'renamed') {
    await makeParents(plan, c.path, journal);
    if (await lstatOrNull(target)) await journal.setAside(target);
    await journal.move(join(plan.base, c.from as string), target);
    if (after.kind === 'file' && c.modeChanged) await journal.chmod(target, after.mode);
    return;
  }
  await journal.chmod(target, after.mode);
}

async function copyVerified(
  from: string,
  to: string,
  after: EntryState,
  owner: { uid: number; gid: number } | undefined,
): Promise<void> {
  const src = await openNoFollow(from);
  const dst = await open(
    to,
    constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
    0o600,
  );
  try {
    const hash = createHash('sha256');
    const buf = Buffer.allocUnsafe(1 << 16);
    for (;;) {
      const { bytesRead } = await src.read(buf, 0, buf.length, null);
      if (bytesRead === 0) break;
      hash.update(buf.subarray(0, bytesRead));
      await dst.write(buf, 0, bytesRead);
    }
    if (hash.digest('hex') !== after.sha256) {
      throw new Error('the file changed in the sandbox while it was copied');
    }
    if (owner) await dst.chown(owner.uid, owner.gid);
    await dst.chmod(after.mode & 0o777);
    await dst.datasync();
  } finally {
    await Promise.all([src.close(), dst.close()]);
  }
}

/** As root, a written entry belongs to the owner of what it replaces, or of its folder. */
async function ownerFor(
  plan: Plan,
  path: string,
): Promise<{ uid: number; gid: number } | undefined> {
  if (!isRoot()) return undefined;
  const st =
    (await lstatOrNull(join(plan.base, path))) ??
    (await lstatOrNull(join(plan.base, ...path.split('/').slice(0, -1))));
  return st ? { uid: st.uid, gid: st.gid } : undefined;
}

/** Creates the missing parents one by one (each checked not to be a link), modes as the view's. */
async function makeParents(plan: Plan, path: string, journal: ApplyJournal): Promise<void> {
  const parts = path.split('/').slice(0, -1);
  for (let i = 1; i <= parts.length; i++) {
    const prefix = parts.slice(0, i).join('/');
    const full = join(plan.base, prefix);
    const st = await lstatOrNull(full);
    if (st?.isDirectory()) continue;
    if (st) throw new Error(`${prefix} in the base is not a folder`);
    const vs = await lstatOrNull(join(plan.view, prefix));
    await mkdir(full, { mode: vs?.isDirectory() ? vs.mode & 0o777 : 0o755 });
    journal.made(full, true);
    if (isRoot()) {
      const ps = await lstatOrNull(join(plan.base, ...parts.slice(0, i - 1)));
      if (ps) await chown(full, ps.uid, ps.gid);
    }
  }
}

/** After a removal: the emptied parents go, up to the first that is a folder in the view. */
async function prune(plan: Plan, path: string): Promise<void> {
  const parts = path.split('/').slice(0, -1);
  while (parts.length > 0) {
    const prefix = parts.join('/');
    const vs = await lstatOrNull(join(plan.view, prefix));
    if (vs?.isDirectory()) return;
    try {
      await rmdir(join(plan.base, prefix));
    } catch {
      return;
    }
    parts.pop();
  }
}
