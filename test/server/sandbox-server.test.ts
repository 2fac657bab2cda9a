import { expect, test } from 'vitest';
import { SandboxServer } from '../../runtime/server/server.js';
import { call } from './harness.js';

test('SandboxServer: register, start, call, stop in-process', async () => {
  const server = new SandboxServer({ token: 'in-process', groups: ['COMMANDS'] });
  server.register(
    'multiply',
    async ({ x, y }) => (x as number) * (y as number),
    [
      { name: 'x', type: 'int', required: true },
      { name: 'y', type: 'int', required: false, default: 3 },
    ],
    { description: 'x times y' },
  );
  expect(() => server.register('multiply', () => 0)).toThrow('registered twice');
  expect(() => server.register('bad name', () => 0)).toThrow('must start with a letter');
  const { host, port } = await server.start();
  try {
    const url = `http://${host}:${port}`;
    const answer = await call(url, '/commands/multiply', { body: { x: 7 }, token: 'in-process' });
    expect(answer.json).toEqual({ result: 21 });
    const listed = await call(url, '/commands/multiply', { token: 'in-process' });
    expect(listed.json).toEqual({
      name: 'multiply',
      description: 'x times y',
      args: [
        { name: 'x', type: 'int', required: true },
        { name: 'y', type: 'int', required: false, default: 3 },
      ],
    });
    const files = await call(url, '/files/list', { token: 'in-process' });
    expect(files.json.type).toBe('CapabilityDisabledError');
  } finally {
    await server.stop();
  }
  await server.stopped;
});
