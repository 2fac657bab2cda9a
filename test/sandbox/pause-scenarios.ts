import { expect } from 'vitest';
import { type ConnectionOptions, Sandbox } from '../../src/index.js';

/**
 * What pause and resume must do on every provider, as a user of the SDK sees it. Each provider's
 * test file (pause.test.ts: local as root; pause-rootless, pause-docker) runs these against its
 * own daemon.
 */

/** A shell loop counting in /tmp/c, 20 times a second, for as long as it is not stopped. */
export const COUNTER = 'i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.05; done';

export async function counterValue(box: Sandbox): Promise<number> {
  for (let attempt = 0; ; attempt++) {
    const text = (await box.commands.run('cat /tmp/c')).stdout.trim();
    // The loop may be between truncating and writing the file.
    if (text !== '' || attempt > 20) return Number(text);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A frozen sandbox's processes do not run while it is paused, and go on from where they were
 * (the same process, its count not restarted) after a resume; the state shows `paused` meanwhile.
 */
export async function freezeKeepsProcesses(connection: ConnectionOptions): Promise<void> {
  const box = await Sandbox.create(connection);
  try {
    const counter = await box.commands.start(COUNTER);
    await box.commands.run('sleep 0.3');
    const before = await counterValue(box);
    expect(before).toBeGreaterThan(0);
    expect(await box.pause()).toBe(true);
    const info = await box.getInfo();
    expect(info.state).toBe('paused');
    expect(info.paused?.memory).toBe(true);
    // Two seconds frozen: a running loop would count 40 more.
    await sleep(2000);
    expect(await box.resume()).toBe(true);
    const after = await counterValue(box);
    expect(after).toBeGreaterThanOrEqual(before);
    expect(after - before).toBeLessThan(30);
    // The same process goes on counting.
    await box.commands.run('sleep 0.5');
    expect(await counterValue(box)).toBeGreaterThan(after);
    const listed = await box.commands.list();
    expect(listed.find((p) => p.pid === counter.pid)?.running).toBe(true);
    expect((await box.getInfo()).state).toBe('running');
  } finally {
    await box.kill();
  }
}

/**
 * A hibernated sandbox's processes end; its files in the home and /tmp (written just before the
 * pause, as in E2B #884 and #1104) and its environment (the create's envs) come back with a
 * resume, which `restart` (a daemon killed with SIGKILL and started again) does not lose.
 */
export async function hibernateKeepsFiles(
  connection: ConnectionOptions,
  restart?: () => Promise<void>,
): Promise<void> {
  const box = await Sandbox.create({ ...connection, envs: { KEPT: 'across a hibernate' } });
  try {
    await box.commands.start(COUNTER);
    await box.files.write('notes/before.txt', 'written well before');
    await box.commands.run('sleep 0.2');
    // Written an instant before the pause, without waiting for anything else.
    await box.commands.run(
      'head -c 3000000 /dev/urandom > /tmp/blob && sha256sum /tmp/blob > ~/blob.sum && echo last > ~/last.txt',
    );
    const sum = (await box.commands.run('cat ~/blob.sum')).stdout;
    expect(await box.pause({ memory: false })).toBe(true);
    const paused = await box.getInfo();
    expect(paused.state).toBe('paused');
    expect(paused.paused?.memory).toBe(false);
    await restart?.();
    // Sandbox.connect resumes a paused sandbox (E2B's behaviour).
    const again = await Sandbox.connect(box.sandboxId, connection);
    expect((await again.getInfo()).state).toBe('running');
    expect(await again.files.read('notes/before.txt')).toBe('written well before');
    expect((await again.commands.run('cat ~/last.txt')).stdout).toBe('last\n');
    expect((await again.commands.run('sha256sum /tmp/blob')).stdout).toBe(sum);
    expect((await again.commands.run('echo "$KEPT"')).stdout).toBe('across a hibernate\n');
    // Its processes ended: the counter is not running and does not move.
    const value = await counterValue(again);
    await again.commands.run('sleep 0.3');
    expect(await counterValue(again)).toBe(value);
    expect((await again.commands.list()).filter((p) => p.running).length).toBeLessThanOrEqual(1);
    // It runs on as any sandbox: a new file, a second hibernate and resume.
    await again.files.write('after.txt', 'new');
    expect(await again.pause({ memory: false })).toBe(true);
    expect(await again.resume()).toBe(true);
    expect(await again.files.read('after.txt')).toBe('new');
  } finally {
    await box.kill();
  }
}

/**
 * A call through the SDK to a paused sandbox resumes it (a command, a file read); a pause of a
 * paused sandbox answers false; a paused sandbox is killed like any other.
 */
export async function sdkCallsResume(connection: ConnectionOptions): Promise<void> {
  const box = await Sandbox.create(connection);
  try {
    await box.files.write('a.txt', 'one');
    expect(await box.pause()).toBe(true);
    expect(await box.pause()).toBe(false);
    expect(await box.files.read('a.txt')).toBe('one');
    expect((await box.getInfo()).state).toBe('running');
    expect(await box.pause({ memory: false })).toBe(true);
    expect((await box.commands.run('cat a.txt')).stdout).toBe('one');
    expect(await box.resume()).toBe(false);
    expect(await box.pause()).toBe(true);
    expect(await box.kill()).toBe(true);
    const ended = await box.getInfo();
    expect(ended.state).toBe('killed');
  } finally {
    await box.kill();
  }
}
