import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  getDefaultEnvironment,
  StdioClientTransport,
} from '@modelcontextprotocol/sdk/client/stdio.js';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { FILE_TOOL_NAMES, Sandbox, type SandboxTool } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { servedSandbox } from '../helpers/server-e2e.js';

const ENTRY = join(ROOT, 'test', 'mcp', 'mcp-entry.mjs');

let served: Awaited<ReturnType<typeof servedSandbox>>;
let abx: Awaited<ReturnType<typeof createAbxHome>>;
let sandbox: Sandbox;
let tools: SandboxTool[];
const clients: Client[] = [];

beforeAll(async () => {
  served = await servedSandbox();
  ({ abx, sandbox } = served);
  tools = await sandbox.tools();
}, 300_000);

afterEach(async () => {
  for (const client of clients.splice(0)) await client.close().catch(() => undefined);
});

afterAll(async () => {
  await served?.close();
});

/** An MCP client of a server spawned with `command args`, as an MCP host would run it. */
async function connect(command: string, args: string[]): Promise<Client> {
  const client = new Client({ name: 'abx-test', version: '1.0.0' });
  clients.push(client);
  await client.connect(
    new StdioClientTransport({
      command,
      args,
      cwd: ROOT,
      env: { ...getDefaultEnvironment(), ABX_HOME: abx.home },
      stderr: 'pipe',
    }),
  );
  return client;
}

const serve = (options: Record<string, unknown>) =>
  connect(process.execPath, [ENTRY, JSON.stringify({ home: abx.home, ...options })]);

const runningIds = async () =>
  (await Sandbox.list({ home: abx.home, state: 'running' })).map((s) => s.sandboxId);

describe('serveMcp over stdio, with the SDK client', () => {
  test('lists the same tools as sandbox.tools() and calls them', async () => {
    const client = await serve({ sandboxId: sandbox.sandboxId });
    const listed = (await client.listTools()).tools;
    expect(listed.map((t) => t.name)).toEqual(tools.map((t) => t.name));
    expect(listed.map((t) => t.name)).toEqual(expect.arrayContaining([...FILE_TOOL_NAMES]));
    expect(listed.find((t) => t.name === 'add')).toMatchObject({
      description: 'Add two numbers',
      inputSchema: tools.find((t) => t.name === 'add')?.parameters,
    });

    const add = await client.callTool({ name: 'add', arguments: { x: 40 } });
    expect(add.isError).toBeFalsy();
    expect(add.content).toEqual([{ type: 'text', text: '42' }]);
    const shout = await client.callTool({ name: 'shout', arguments: { text: 'mcp' } });
    expect(shout.structuredContent).toEqual({ stdout: 'MCP', stderr: '', exitCode: 0 });
    expect(JSON.parse((shout.content as { text: string }[])[0]?.text ?? '')).toEqual(
      shout.structuredContent,
    );
  });

  test('failing calls are MCP tool errors with the remote type, and the server goes on', async () => {
    const client = await serve({ sandboxId: sandbox.sandboxId });
    const thrown = await client.callTool({ name: 'fail', arguments: { message: 'boom' } });
    expect(thrown.isError).toBe(true);
    expect(thrown.structuredContent).toEqual({ error: 'boom', type: 'RangeError' });
    expect(thrown.content).toEqual([
      { type: 'text', text: JSON.stringify({ error: 'boom', type: 'RangeError' }) },
    ]);

    const bad = await client.callTool({ name: 'add', arguments: { x: 'one' } });
    expect(bad.isError).toBe(true);
    expect(bad.structuredContent).toMatchObject({
      type: 'ArgumentError',
      error: expect.stringContaining('x must be a number'),
    });
    const missing = await client.callTool({
      name: 'read_file',
      arguments: { file_path: '/home/user/none.txt' },
    });
    expect(missing.structuredContent).toMatchObject({ type: 'FileOperationError' });
    const unknown = await client.callTool({ name: 'nope', arguments: {} });
    expect(unknown.structuredContent).toMatchObject({ type: 'ToolNotFoundError' });

    // Still serving.
    const after = await client.callTool({
      name: 'execute',
      arguments: { command: 'echo still here' },
    });
    expect(after.structuredContent).toEqual({
      output: 'still here\n',
      exitCode: 0,
      truncated: false,
    });
    // A sandbox named by id is not the server's to kill.
    await client.close();
    expect(await sandbox.isRunning()).toBe(true);
  });

  test('--template: a sandbox is created on first use and killed when the client leaves', async () => {
    const before = await runningIds();
    const client = await serve({ template: 'server-e2e' });
    const listed = (await client.listTools()).tools.map((t) => t.name);
    // A fresh sandbox: its template's YAML command and the file tools, no command server.
    expect(listed).toEqual(['shout', 'run_code', ...FILE_TOOL_NAMES]);
    const created = (await runningIds()).filter((id) => !before.includes(id));
    expect(created).toHaveLength(1);
    const hostname = await client.callTool({ name: 'execute', arguments: { command: 'hostname' } });
    expect(hostname.structuredContent).toMatchObject({ output: `${created[0]}\n` });

    await client.close();
    expect(await runningIds()).toEqual(before);
  });

  test('abx mcp --template serves the same tools', async () => {
    const before = await runningIds();
    const client = await connect(process.execPath, [
      join(ROOT, 'dist', 'cli.js'),
      'mcp',
      '--template',
      'server-e2e',
    ]);
    const listed = (await client.listTools()).tools.map((t) => t.name);
    expect(listed).toEqual(['shout', 'run_code', ...FILE_TOOL_NAMES]);
    const shout = await client.callTool({ name: 'shout', arguments: { text: 'cli' } });
    expect(shout.structuredContent).toMatchObject({ stdout: 'CLI' });
    await client.close();
    expect(await runningIds()).toEqual(before);
  });

  test('abx mcp --home works in the clean environment MCP clients give, and says which home', async () => {
    // As Claude Desktop and the inspector start servers: no ABX_HOME, a HOME without an install.
    const bare = mkdtempSync(join(tmpdir(), 'abx-mcp-home-'));
    try {
      const client = new Client({ name: 'abx-test', version: '1.0.0' });
      clients.push(client);
      await client.connect(
        new StdioClientTransport({
          command: process.execPath,
          args: [join(ROOT, 'dist', 'cli.js'), 'mcp', sandbox.sandboxId, '--home', abx.home],
          cwd: bare,
          env: { ...getDefaultEnvironment(), HOME: bare },
          stderr: 'pipe',
        }),
      );
      expect(client.getInstructions()).toContain(`sandbox ${sandbox.sandboxId}`);
      expect(client.getInstructions()).toContain(`Installation: ${abx.home}.`);
      const hostname = await client.callTool({
        name: 'execute',
        arguments: { command: 'hostname' },
      });
      expect(hostname.structuredContent).toMatchObject({ output: `${sandbox.sandboxId}\n` });
      await client.close();
      expect(existsSync(join(bare, '.abx'))).toBe(false);
    } finally {
      rmSync(bare, { recursive: true, force: true });
    }
  });

  test('without --home, a default home with no daemon is refused while another runs: no second daemon', () => {
    const bare = mkdtempSync(join(tmpdir(), 'abx-mcp-home-'));
    try {
      const env = { ...getDefaultEnvironment(), HOME: bare };
      const result = spawnSync(
        process.execPath,
        [join(ROOT, 'dist', 'cli.js'), 'mcp', '--template', 'base'],
        { cwd: bare, env, encoding: 'utf8', input: '', timeout: 60_000 },
      );
      expect(result.status).toBe(2);
      expect(result.stderr).toContain(
        `no daemon runs under the default home ${join(bare, '.abx')}`,
      );
      expect(result.stderr).toContain(abx.home);
      expect(result.stderr).toContain('--home');
      // Nothing was started or written under the default home.
      expect(existsSync(join(bare, '.abx', 'daemon.json'))).toBe(false);
    } finally {
      rmSync(bare, { recursive: true, force: true });
    }
  });
});
