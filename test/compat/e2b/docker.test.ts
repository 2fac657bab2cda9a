import { CommandExitError, type Sandbox as E2bSandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../../src/index.js';
import { dockerEngine } from '../../helpers/docker-images.js';
import { attach } from './attach.js';
import { type DockerHome, dockerHome } from './docker-home.js';

// envd's E2B face on the Docker provider: the same SDK calls as on the local provider
// (process.test.ts, filesystem.test.ts), against a sandbox in a container. Skipped, saying why,
// only when no Docker engine answers.
const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`E2B envd face on docker: skipped, ${engine.reason}`, () => {
    test('commands, PTY and files on docker', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;
  let native: Sandbox;
  let sbx: E2bSandbox;

  beforeAll(async () => {
    abx = await dockerHome(docker);
    native = await Sandbox.create({ home: abx.home });
    sbx = attach(new URL(native.getUrl(49983)).origin, native.sandboxId, native.accessToken);
  }, 900_000);

  afterAll(async () => {
    await native?.kill().catch(() => undefined);
    await abx?.close();
  });

  describe('E2B envd face on docker', () => {
    test('commands: run, exit codes, background with stdin, kill', async () => {
      expect(
        (await sbx.commands.run('echo "$A"; pwd', { envs: { A: 'b' }, cwd: '/tmp' })).stdout,
      ).toBe('b\n/tmp\n');
      const failure = await sbx.commands.run('exit 4').catch((e: unknown) => e);
      expect(failure).toBeInstanceOf(CommandExitError);
      expect(failure).toMatchObject({ exitCode: 4 });
      const cat = await sbx.commands.run('cat', { background: true, stdin: true });
      await sbx.commands.sendStdin(cat.pid, 'in\n');
      await sbx.commands.closeStdin(cat.pid);
      expect((await cat.wait()).stdout).toBe('in\n');
      const sleeper = await sbx.commands.run('sleep 60', { background: true, timeoutMs: 0 });
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);
      expect(await sbx.commands.kill(sleeper.pid)).toBe(true);
      // Once it has ended (SIGKILL is sent, not waited for), its pid is unknown: kill is false.
      let again = true;
      for (let i = 0; i < 100 && again; i++) {
        again = await sbx.commands.kill(sleeper.pid);
        if (again) await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(again).toBe(false);
    });

    test('a PTY: input, resize and bytes that are not UTF-8', async () => {
      let screen = '';
      const chunks: Uint8Array[] = [];
      const decoder = new TextDecoder();
      const terminal = await sbx.pty.create({
        cols: 80,
        rows: 24,
        timeoutMs: 0,
        onData: (data) => {
          chunks.push(data);
          screen += decoder.decode(data, { stream: true });
        },
      });
      await sbx.pty.resize(terminal.pid, { cols: 120, rows: 40 });
      // Input once the shell has drawn its prompt: a line typed before it sets up its terminal
      // can be lost (on a loaded machine the shell starts after the input arrives).
      for (let i = 0; i < 100 && screen.length === 0; i++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await sbx.pty.sendInput(
        terminal.pid,
        new TextEncoder().encode("stty size; printf 'X\\377\\376\\000AY'\n"),
      );
      // The echoed line is ASCII: only printf's output holds the bytes between X and Y.
      const bytes = Buffer.from([0x58, 0xff, 0xfe, 0x00, 0x41, 0x59]);
      const deadline = Date.now() + 15_000;
      const done = () => screen.includes('40 120') && Buffer.concat(chunks).includes(bytes);
      while (!done() && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(screen).toContain('40 120');
      expect(Buffer.concat(chunks).includes(bytes)).toBe(true);
      expect(await sbx.pty.kill(terminal.pid)).toBe(true);
    });

    test('files: write, read, list, stat', async () => {
      await sbx.files.write('/tmp/e2b/a.txt', 'alpha');
      expect(await sbx.files.read('/tmp/e2b/a.txt')).toBe('alpha');
      expect((await sbx.files.list('/tmp/e2b')).map((e) => e.name)).toEqual(['a.txt']);
      expect(await sbx.files.getInfo('/tmp/e2b/a.txt')).toMatchObject({ type: 'file', size: 5 });
    });

    test('file metadata on overlayfs: kept through mv, dropped with rm, not inherited by a new file', async () => {
      await sbx.files.write('/tmp/e2b/m.txt', 'm', { metadata: { layer: 'upper' } });
      await sbx.commands.run('mv /tmp/e2b/m.txt /home/user/m.txt');
      expect((await sbx.files.getInfo('/home/user/m.txt')).metadata).toEqual({ layer: 'upper' });
      await sbx.commands.run('rm /home/user/m.txt && echo new > /home/user/m.txt');
      expect((await sbx.files.getInfo('/home/user/m.txt')).metadata).toBeUndefined();
    });
  });
}
