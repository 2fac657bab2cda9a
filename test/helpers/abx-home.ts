import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { orphanNetProcesses } from '../../src/egress/sandbox-net.js';
import { stopDaemon } from '../../src/installation/daemon-connection.js';
import { unmountUnder } from '../../src/providers/local/volumes.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { Templates } from '../../src/sandbox/templates.js';
import { ensureBuilt } from './build.js';

/** Pids of processes whose command line mentions `text` (e.g. a test's ABX_HOME). */
export function processesMentioning(text: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmdline.includes(text) && Number(entry) !== process.pid) pids.push(Number(entry));
    } catch {
      // ended meanwhile
    }
  }
  return pids;
}

/** SIGKILLs each pid; one already gone (killing a sandbox's init ends the rest) is no error. */
export function sigkillAll(pids: Iterable<number>): void {
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
}

/**
 * Pids of one sandbox's processes: its bwrap processes (which carry the sandbox id as
 * `--hostname`) and all their descendants. Sandbox command lines name no host folder.
 */
export function sandboxProcesses(sandboxId: string): number[] {
  const parents = new Map<number, number>();
  const roots: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (fields[0] === 'Z') continue;
      parents.set(Number(entry), Number(fields[1]));
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      const at = argv.indexOf('--hostname');
      if (argv[0]?.endsWith('bwrap') && at > 0 && argv[at + 1] === sandboxId) {
        roots.push(Number(entry));
      }
    } catch {
      // ended meanwhile
    }
  }
  const found = new Set(roots);
  for (let grew = true; grew; ) {
    grew = false;
    for (const [pid, parent] of parents) {
      if (!found.has(pid) && found.has(parent)) {
        found.add(pid);
        grew = true;
      }
    }
  }
  return [...found];
}

/**
 * A private installation for one test file: its own `$ABX_HOME`, daemon and sandboxes. `close()`
 * kills every sandbox, stops the daemon and SIGKILLs anything still mentioning the folder, so a
 * failing test leaves nothing behind.
 */
export async function createAbxHome(): Promise<{ home: string; close(): Promise<void> }> {
  ensureBuilt();
  const home = await mkdtemp(join(tmpdir(), 'abx-home-'));
  return {
    home,
    async close() {
      try {
        const live = await Sandbox.list({ home, state: ['running', 'paused'], autoStart: false });
        for (const info of live) {
          await Sandbox.kill(info.sandboxId, { home, autoStart: false });
        }
      } catch {
        // no daemon: the sweep below still cleans up
      }
      await stopDaemon(home).catch(() => undefined);
      // Sandboxes' command lines name no host folder: find what is left by the ids of its folders.
      const ids = existsSync(join(home, 'sandboxes')) ? readdirSync(join(home, 'sandboxes')) : [];
      // An internet sandbox's namespace holder and slirp4netns carry its id in a tag.
      const nets = orphanNetProcesses((id) => ids.includes(id));
      // A frozen process (cgroup v1's freezer) dies of SIGKILL only once thawed.
      for (const id of ids) {
        try {
          writeFileSync(`/sys/fs/cgroup/freezer/abx/${id}/freezer.state`, 'THAWED');
        } catch {
          // not frozen, or no freezer cgroup
        }
      }
      sigkillAll([...processesMentioning(home), ...ids.flatMap(sandboxProcesses), ...nets]);
      // Volumes' disks stay mounted on the host: never a recursive removal across them.
      await unmountUnder(home);
      await rm(home, { recursive: true, force: true });
    },
  };
}

/**
 * Removes every template of `home` but `base`: image templates own images on the engine, which
 * outlive the installation's folder. Best effort, for a test's teardown.
 */
export async function removeTemplates(home: string | undefined): Promise<void> {
  for (const template of home ? await Templates.list({ home }).catch(() => []) : []) {
    if (template.name !== 'base') await Templates.remove(template.name, { home }).catch(() => {});
  }
}
