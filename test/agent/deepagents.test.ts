import {
  createFilesystemMiddleware,
  isSandboxBackend,
  type SandboxBackendProtocolV2,
} from 'deepagents';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type DeepAgentsBackend, deepAgentsBackend, Sandbox } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let sandbox: Sandbox;
let backend: DeepAgentsBackend;
/** What this test needs of a LangChain tool (kept structural: @langchain/core is deepagents' peer). */
interface LangChainTool {
  name: string;
  invoke(call: unknown): Promise<unknown>;
}
type MessageContent = string | ({ text: string } | Record<string, unknown>)[];
let tools: LangChainTool[];

beforeAll(async () => {
  abx = await createAbxHome();
  sandbox = await Sandbox.create({ home: abx.home });
  backend = deepAgentsBackend(sandbox);
  // deepagents' own file tools, as its agents get them for a sandbox backend.
  tools = (createFilesystemMiddleware({ backend }).tools ?? []) as LangChainTool[];
}, 300_000);

afterAll(async () => {
  await sandbox?.kill().catch(() => undefined);
  await abx?.close();
});

let calls = 0;

/** Runs one of deepagents' tools as its agent loop does: a tool call in, text out. */
async function call(name: string, args: Record<string, unknown>): Promise<string> {
  const found = tools.find((t) => t.name === name);
  if (!found) throw new Error(`deepagents has no tool ${name}`);
  calls += 1;
  const result: unknown = await found.invoke({
    id: `call-${calls}`,
    name,
    args,
    type: 'tool_call',
  });
  const content = (result as { content: MessageContent }).content;
  if (typeof content === 'string') return content;
  return content
    .map((block) => (typeof block.text === 'string' ? block.text : JSON.stringify(block)))
    .join('');
}

describe('deepAgentsBackend(sandbox)', () => {
  test('is a deepagents sandbox backend (type and runtime check)', () => {
    const typed: SandboxBackendProtocolV2 = backend;
    expect(isSandboxBackend(typed)).toBe(true);
    expect(backend.id).toBe(sandbox.sandboxId);
    expect(tools.map((t) => t.name)).toEqual(
      expect.arrayContaining([
        'ls',
        'read_file',
        'write_file',
        'edit_file',
        'glob',
        'grep',
        'execute',
      ]),
    );
  });

  test("deepagents' file tools write, edit, read, list, find and search in the sandbox", async () => {
    const dir = '/home/user/da';
    expect(
      await call('write_file', { file_path: `${dir}/notes.md`, content: 'alpha\nbeta\n' }),
    ).toBe(`Successfully wrote to '${dir}/notes.md'`);
    expect(await sandbox.files.read(`${dir}/notes.md`)).toBe('alpha\nbeta\n');
    expect(
      await call('edit_file', {
        file_path: `${dir}/notes.md`,
        old_string: 'beta',
        new_string: 'gamma',
      }),
    ).toBe(`Successfully replaced 1 occurrence(s) in '${dir}/notes.md'`);
    expect(await sandbox.files.read(`${dir}/notes.md`)).toBe('alpha\ngamma\n');

    const read = await call('read_file', { file_path: `${dir}/notes.md` });
    expect(read).toContain('alpha');
    expect(read).toContain('gamma');
    expect(read).not.toContain('beta');

    await sandbox.files.write(`${dir}/sub/deep.md`, 'gamma ray\n');
    const listing = await call('ls', { path: dir });
    expect(listing.split('\n').sort()).toEqual([
      `${dir}/notes.md (12 bytes)`,
      `${dir}/sub/ (directory)`,
    ]);
    expect((await call('glob', { pattern: '**/*.md', path: dir })).split('\n').sort()).toEqual([
      `${dir}/notes.md`,
      `${dir}/sub/deep.md`,
    ]);
    const grep = await call('grep', {
      pattern: 'gamma',
      path: dir,
      output_mode: 'files_with_matches',
    });
    expect(grep.split('\n').sort()).toEqual([`${dir}/notes.md`, `${dir}/sub/deep.md`]);
    expect(await call('execute', { command: `cat ${dir}/sub/deep.md; exit 4` })).toBe(
      'gamma ray\n\n[Command failed with exit code 4]',
    );
    expect(await call('delete', { file_path: `${dir}/sub` })).toBe(`Deleted ${dir}/sub`);
    expect(await sandbox.execute(`test -e ${dir}/sub`)).toMatchObject({ exitCode: 1 });
  });

  test('failures come back to the model as text, not exceptions', async () => {
    expect(await call('read_file', { file_path: '/home/user/none.txt' })).toMatch(/^Error: /);
    expect(
      await call('edit_file', {
        file_path: '/home/user/da/notes.md',
        old_string: 'absent',
        new_string: 'x',
      }),
    ).toContain('not found');
    expect(await call('ls', { path: '/home/user/none' })).toMatch(/^Error listing files: /);
  });

  test('binary files come back as bytes with a MIME type', async () => {
    const png = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 1, 2]);
    await sandbox.files.write('/home/user/da/pixel.png', png);
    expect(await backend.read('/home/user/da/pixel.png')).toEqual({
      content: png,
      mimeType: 'image/png',
    });
    const raw = await backend.readRaw('/home/user/da/pixel.png');
    expect(raw).toMatchObject({ data: { content: png, mimeType: 'image/png' } });
    expect(await call('read_file', { file_path: '/home/user/da/pixel.png' })).toContain('image');
  });
});
