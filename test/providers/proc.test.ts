import { type ChildProcess, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { afterEach, describe, expect, test } from 'vitest';
import { processTree } from '../../src/providers/local/proc.js';

/** The oracle: descendants of `pid` from every process's parent pid in /proc/PID/stat. */
function treeFromStat(pid: number): number[] {
  const parents = new Map<number, number>();
  for (const entry of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // ended meanwhile
    }
  }
  const tree = [pid];
  for (let i = 0; i < tree.length; i++) {
    for (const [child, parent] of parents) if (parent === tree[i]) tree.push(child);
  }
  return tree;
}

const started: ChildProcess[] = [];
afterEach(() => {
  for (const child of started.splice(0)) {
    // The whole group: the shell's and the worker's children too.
    try {
      process.kill(-(child.pid as number), 'SIGKILL');
    } catch {
      // ended
    }
  }
});

async function settled(pid: number, count: number): Promise<number[]> {
  for (let i = 0; i < 200; i++) {
    const tree = treeFromStat(pid);
    if (tree.length >= count) return tree;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`the tree of ${pid} never had ${count} processes: ${treeFromStat(pid)}`);
}

describe('processTree', () => {
  test('finds every descendant, three levels down, as the parent pids in /proc say', async () => {
    const child = spawn('sh', ['-c', 'sleep 30 & (sleep 30 & sleep 30 & wait) & wait'], {
      detached: true,
      stdio: 'ignore',
    });
    started.push(child);
    const expected = await settled(child.pid as number, 5);
    expect(processTree(child.pid as number).sort()).toEqual(expected.sort());
  });

  test('finds a child forked by another thread than the main one (a worker thread’s spawn)', async () => {
    // Node's worker thread spawns `sleep`: the kernel lists it under the worker's thread only.
    const script = `const { Worker } = require('node:worker_threads');
      new Worker("require('node:child_process').spawn('sleep', ['30'], { stdio: 'ignore' }); setInterval(() => {}, 1000);", { eval: true });
      setInterval(() => {}, 1000);`;
    const child = spawn(process.execPath, ['-e', script], { detached: true, stdio: 'ignore' });
    started.push(child);
    // Until the worker's child runs `sleep` (a child just forked is still a copy of node).
    let expected: number[] = [];
    for (let i = 0; i < 200; i++) {
      expected = await settled(child.pid as number, 2);
      const kids = expected.filter((pid) => pid !== child.pid);
      const commands = kids.map((pid) => {
        try {
          return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
        } catch {
          return '';
        }
      });
      if (kids.length === 1 && commands[0] === 'sleep\u000030\u0000') break;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    const tree = processTree(child.pid as number);
    expect(tree.sort()).toEqual(expected.sort());
    const sleeper = tree.find((pid) => pid !== child.pid) as number;
    expect(readFileSync(`/proc/${sleeper}/cmdline`, 'utf8')).toBe('sleep\u000030\u0000');
  });

  test('a process that has ended is only itself, as before', () => {
    expect(processTree(2 ** 22 + 1)).toEqual([2 ** 22 + 1]);
  });
});
