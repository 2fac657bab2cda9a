import { randomBytes } from 'node:crypto';
import { link, opendir, rename, rmdir, unlink } from 'node:fs/promises';
import { basename, dirname, join, relative } from 'node:path';
import { lstatOrNull, openNoFollow } from './entry.js';

/** Every temporary file and backup an apply makes starts with this (docs/workspaces.md). */
export const APPLY_TEMP_PREFIX = '.abx-apply-';

/** One step an apply took in the base, as its undo needs it. */
type Step =
  /** A new entry (a temporary file or link, a folder): undone by removing it. */
  | { kind: 'made'; path: string; folder: boolean }
  /** An entry renamed: undone by renaming it back (a backup put back over what replaced it). */
  | { kind: 'moved'; from: string; to: string }
  /** A new entry renamed over `path`; the old one, if any, was hard-linked to `backup`. */
  | { kind: 'replaced'; path: string; backup?: string }
  /** A mode changed: undone by setting the old one. */
  | { kind: 'chmod'; path: string; mode: number };

/** What a rollback did and could not do. */
export interface Rollback {
  /** Paths (relative to the base) the undo could not put back as they were, or left behind. */
  notRestored: string[];
  /** Each undo step, in the order done (`put back a.txt`, `could not remove …: EACCES …`). */
  undone: string[];
}

/**
 * The undo journal of one apply: every step that touches the base goes through it, so a
 * failure can put the base back as it was, step by step in reverse. Nothing the apply replaces,
 * deletes or renames away is removed before the end: it is kept under a backup name in its own
 * folder (`.abx-apply-<random>.<name>.bak`: a rename, or a hard link for an entry replaced by a
 * rename over it, so that a reader never sees the path missing), and the backups go only once
 * every step has succeeded ({@link ApplyJournal.finish}).
 */
export class ApplyJournal {
  private readonly steps: Step[] = [];
  private readonly backups: string[] = [];

  constructor(private readonly base: string) {}

  /** A temporary name in `dir` (a file being written). */
  static tempIn(dir: string): string {
    return join(dir, `${APPLY_TEMP_PREFIX}${randomBytes(6).toString('hex')}`);
  }

  /** Records a new entry the apply made (so that an undo removes it). */
  made(path: string, folder = false): void {
    this.steps.push({ kind: 'made', path, folder });
  }

  /** Renames `from` to `to` (nothing at `to`: the caller checked), recorded. */
  async move(from: string, to: string): Promise<void> {
    await rename(from, to);
    this.steps.push({ kind: 'moved', from, to });
  }

  /** Moves the entry at `path` (a file, link or folder) aside to a backup name; recorded. */
  async setAside(path: string): Promise<void> {
    const backup = backupName(path);
    await this.move(path, backup);
    this.backups.push(backup);
  }

  /**
   * Renames the new entry `tmp` over `path`, keeping what was there as a hard-linked backup so
   * that `path` is never missing; where a hard link is not allowed (another user's file under
   * `fs.protected_hardlinks`, a file system without them), the old entry is renamed aside first.
   */
  async replace(tmp: string, path: string): Promise<void> {
    let backup: string | undefined;
    const name = backupName(path);
    try {
      await link(path, name);
      backup = name;
      this.backups.push(name);
    } catch (err) {
      // Nothing there; else a folder (EPERM) or a link not allowed: the old entry goes aside.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || (await lstatOrNull(path))) {
        await this.setAside(path);
      }
    }
    try {
      await rename(tmp, path);
    } catch (err) {
      if (backup) {
        this.backups.pop();
        await unlink(backup).catch(() => {});
      }
      throw err;
    }
    this.steps.push({ kind: 'replaced', path, ...(backup ? { backup } : {}) });
  }

  /** Sets the permission bits of `path` (not following a link), recording the old ones. */
  async chmod(path: string, mode: number): Promise<void> {
    const fh = await openNoFollow(path);
    try {
      const old = (await fh.stat()).mode & 0o7777;
      await fh.chmod(mode & 0o777);
      this.steps.push({ kind: 'chmod', path, mode: old });
    } finally {
      await fh.close();
    }
  }

  /** Undoes every step in reverse, best effort: each step tried, each failure named. */
  async rollback(): Promise<Rollback> {
    const notRestored = new Set<string>();
    const undone: string[] = [];
    const rel = (p: string) => relative(this.base, p) || '.';
    for (const step of [...this.steps].reverse()) {
      try {
        switch (step.kind) {
          case 'made':
            await (step.folder ? rmdir(step.path) : unlink(step.path)).catch(ignoreMissing);
            undone.push(`removed the new ${rel(step.path)}`);
            break;
          case 'moved':
            await rename(step.to, step.from);
            undone.push(`moved ${rel(step.to)} back to ${rel(step.from)}`);
            break;
          case 'replaced':
            if (step.backup) await rename(step.backup, step.path);
            else await unlink(step.path).catch(ignoreMissing);
            undone.push(
              step.backup ? `put back the old ${rel(step.path)}` : `removed ${rel(step.path)}`,
            );
            break;
          case 'chmod': {
            const fh = await openNoFollow(step.path);
            try {
              await fh.chmod(step.mode);
            } finally {
              await fh.close();
            }
            undone.push(`set ${rel(step.path)}'s mode back to ${step.mode.toString(8)}`);
            break;
          }
        }
      } catch (err) {
        const what = step.kind === 'moved' ? step.from : step.path;
        notRestored.add(rel(what));
        if (step.kind === 'moved') notRestored.add(rel(step.to));
        if (step.kind === 'replaced' && step.backup) notRestored.add(rel(step.backup));
        undone.push(`could not undo (${step.kind}) ${rel(what)}: ${(err as Error).message}`);
      }
    }
    this.steps.length = 0;
    return { notRestored: [...notRestored].sort(), undone };
  }

  /**
   * Every step succeeded: the backups go (a folder set aside only with what this apply put in
   * it: backups and emptied folders; anything else, say a file the host made there meanwhile,
   * stays in it). Best effort: the apply is done whatever this leaves.
   */
  async finish(): Promise<void> {
    for (const backup of this.backups.reverse()) {
      // ENOENT: in a folder set aside later, and gone with it.
      await unlink(backup).catch(async (err: NodeJS.ErrnoException) => {
        if (err.code === 'EISDIR' || err.code === 'EPERM') await purgeOwn(backup);
      });
    }
    this.backups.length = 0;
    this.steps.length = 0;
  }
}

function ignoreMissing(err: NodeJS.ErrnoException): void {
  if (err.code !== 'ENOENT') throw err;
}

/** `.abx-apply-<random>.<name>.bak` in `path`'s folder, the name cut to keep within 255 bytes. */
function backupName(path: string): string {
  const tag = `${APPLY_TEMP_PREFIX}${randomBytes(6).toString('hex')}.`;
  let name = basename(path);
  while (Buffer.byteLength(`${tag}${name}.bak`) > 255) name = [...name].slice(0, -1).join('');
  return join(dirname(path), `${tag}${name}.bak`);
}

/** Removes a folder set aside: its backups and folders, nothing else (then it stays). */
async function purgeOwn(dir: string): Promise<void> {
  try {
    for await (const d of await opendir(dir)) {
      const p = join(dir, d.name);
      if (d.isDirectory()) await purgeOwn(p);
      else if (d.name.startsWith(APPLY_TEMP_PREFIX)) await unlink(p);
    }
    await rmdir(dir);
  } catch {
    // Something not this apply's is left in it: kept, under the backup's name.
  }
}
