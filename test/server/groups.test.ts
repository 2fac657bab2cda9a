import { afterAll, describe, expect, test } from 'vitest';
import { killLeftovers, startServer } from './harness.js';

afterAll(killLeftovers);

describe('--groups', () => {
  test('a disabled group answers 404 CapabilityDisabledError and is not listed', async () => {
    const server = await startServer(['--groups', 'files,PROCESS']);
    const caps = await server.call('/capabilities');
    expect(caps.json.capabilities.map((c: { name: string }) => c.name)).toEqual([
      'CORE',
      'FILE_OPS',
      'PROCESS',
    ]);
    for (const [path, group] of [
      ['/system/os', 'SYSTEM'],
      ['/commands', 'COMMANDS'],
      ['/terminal/t1/read', 'TERMINAL'],
      ['/dev-tools/git/log', 'DEV_TOOLS'],
    ]) {
      const answer = await server.call(path);
      expect(answer.status, path).toBe(404);
      expect(answer.json.type).toBe('CapabilityDisabledError');
      expect(answer.json.error).toContain(group);
    }
    const post = await server.call('/commands/runshell', { body: { cmd: 'true' } });
    expect(post.json.type).toBe('CapabilityDisabledError');
    expect((await server.call('/files/list?path=/')).status).toBe(200);
    expect((await server.call('/health')).json).toEqual({ status: 'ok' });
    expect((await server.call('/info')).json.groups).toEqual(['CORE', 'FILE_OPS', 'PROCESS']);
  });

  test('groups can be named by prefix, and CORE is always on', async () => {
    const server = await startServer(['--groups', 'dev-tools']);
    const caps = await server.call('/capabilities');
    expect(caps.json.capabilities.map((c: { name: string }) => c.name)).toEqual([
      'CORE',
      'DEV_TOOLS',
    ]);
  });

  test('without a token, no route asks for one', async () => {
    const server = await startServer([]);
    const answer = await server.call('/commands/runshell', { body: { cmd: 'echo free' } });
    expect(answer.json.result.stdout).toBe('free\n');
  });
});
