import { NotFoundError, Sandbox } from '@e2b/code-interpreter';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { dockerEngine } from '../../helpers/docker-images.js';
import { type DockerHome, dockerHome } from './docker-home.js';

// `@e2b/code-interpreter` on the Docker provider: the same package calls as on the local provider
// (code-interpreter.test.ts), against a sandbox in a container of a Debian image with python3 (and
// no matplotlib or pandas). Skipped, saying why, only when no Docker engine answers.
const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`E2B code interpreter on docker: skipped, ${engine.reason}`, () => {
    test('cells and contexts on docker', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;
  let sbx: Sandbox;

  beforeAll(async () => {
    abx = await dockerHome(docker);
    sbx = await Sandbox.create({
      apiKey: abx.apiKey,
      apiUrl: abx.info.apiUrl,
      sandboxUrl: abx.info.gatewayUrl,
      requestTimeoutMs: 120_000,
    });
  }, 900_000);

  afterAll(async () => {
    await sbx?.kill().catch(() => undefined);
    await abx?.close();
  }, 120_000);

  describe('E2B code interpreter on docker', () => {
    test('cells: state, stdout, an error', async () => {
      await sbx.runCode('import sys\nn = 6');
      const execution = await sbx.runCode('print(sys.version_info[0])\nn * 7');
      expect(execution.text).toBe('42');
      expect(execution.logs.stdout).toEqual(['3\n']);
      const failed = await sbx.runCode("raise ValueError('bad value')");
      expect(failed.error).toMatchObject({ name: 'ValueError', value: 'bad value' });
    }, 300_000);

    test('contexts: create, restart, remove; an unknown one is NotFoundError', async () => {
      const context = await sbx.createCodeContext({ cwd: '/tmp' });
      await sbx.runCode('k = 1', { context });
      await sbx.restartCodeContext(context);
      expect((await sbx.runCode('k', { context })).error?.name).toBe('NameError');
      await sbx.removeCodeContext(context);
      await expect(sbx.runCode('1', { context })).rejects.toThrow(NotFoundError);
    }, 300_000);
  });
}
