import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Ajv } from 'ajv';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  CommandDefinitionError,
  callTool,
  commandRegistry,
  FILE_TOOL_NAMES,
  LocalShellSandbox,
  listCommands,
  Sandbox,
  type SandboxTool,
  sandboxTools,
  ToolCallError,
  toAnthropicTools,
  toJSONSchema,
  toOpenAIResponsesTools,
  toOpenAITools,
  toVercelAITools,
} from '../../src/index.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { servedSandbox } from '../helpers/server-e2e.js';

let served: Awaited<ReturnType<typeof servedSandbox>>;
let sandbox: Sandbox;
let tools: SandboxTool[];

beforeAll(async () => {
  served = await servedSandbox();
  ({ sandbox } = served);
  tools = await sandbox.tools();
}, 300_000);

afterAll(async () => {
  await served?.close();
});

const tool = (name: string): SandboxTool => {
  const found = tools.find((t) => t.name === name);
  if (!found) throw new Error(`no tool ${name}`);
  return found;
};

/** The ToolCallError an invoke rejects with (fails the test if it resolves). */
async function failure(name: string, args: unknown): Promise<ToolCallError> {
  const error = await tool(name)
    .invoke(args)
    .then(
      (result) => {
        throw new Error(`expected ${name} to fail, got ${JSON.stringify(result)}`);
      },
      (e: unknown) => e,
    );
  expect(error).toBeInstanceOf(ToolCallError);
  return error as ToolCallError;
}

describe('sandbox.tools()', () => {
  test('one tool per custom command (YAML and decorated) and per file tool', async () => {
    commandRegistry().registerClass(SandboxCommands);
    const custom = (await sandbox.listCommands()).map((c) => c.name);
    expect(custom).toEqual(['shout', ...listCommands('server-e2e').map((c) => c.name)]);
    expect(tools.map((t) => t.name)).toEqual([...custom, 'run_code', ...FILE_TOOL_NAMES]);
    expect(tools.filter((t) => t.kind === 'command').map((t) => t.name)).toEqual(custom);
    // The parameters of a command are its JSON Schema from the command model.
    const { description: _, ...addSchema } = toJSONSchema(
      listCommands('server-e2e').find((c) => c.name === 'add') as never,
    );
    expect(tool('add').parameters).toEqual(addSchema);
    expect(tool('add').description).toBe('Add two numbers');
    expect(tool('read_file').parameters.required).toEqual(['file_path']);
  });

  test('every schema is valid JSON Schema and accepts what invoke accepts', () => {
    const ajv = new Ajv({ strict: true });
    const samples: Record<string, unknown> = {
      shout: { text: 'x' },
      add: { x: 1, y: 2 },
      read_file: { file_path: 'a', offset: 0, limit: 5 },
      edit_file: { file_path: 'a', old_string: 'b', new_string: 'c', replace_all: true },
    };
    for (const t of tools) {
      const validate = ajv.compile(t.parameters);
      if (samples[t.name]) expect(validate(samples[t.name])).toBe(true);
      expect(validate({ not_an_argument: 1 })).toBe(false);
    }
  });

  test('custom commands run in the sandbox: YAML in a shell, decorated on the server', async () => {
    expect(await tool('shout').invoke({ text: "it's $(id)" })).toEqual({
      stdout: "IT'S $(ID)",
      stderr: '',
      exitCode: 0,
    });
    expect(await tool('add').invoke({ x: 40 })).toBe(42);
    expect(await tool('whereAmI').invoke({})).toEqual({
      hostname: sandbox.sandboxId,
      cwd: '/home/user',
      uid: 1000,
    });
  });

  test('bad arguments are refused with every problem, before anything runs', async () => {
    const bad = await failure('add', { x: 'one', z: 1 });
    expect(bad.type).toBe('ArgumentError');
    expect(bad.tool).toBe('add');
    expect(bad.message).toContain('x must be a number, not string "one"');
    expect(bad.message).toContain("unknown argument 'z'");
    const missing = await failure('shout', {});
    expect([missing.type, missing.message]).toEqual([
      'ArgumentError',
      expect.stringContaining('missing required argument: text'),
    ]);
    const file = await failure('read_file', { file_path: 7, offset: -1, extra: true });
    expect(file.type).toBe('ArgumentError');
    expect(file.message).toContain('file_path must be a string, not number 7');
    expect(file.message).toContain('offset must be at least 0, not -1');
    expect(file.message).toContain("unknown argument 'extra'");
    expect((await failure('execute', 'ls')).message).toContain('arguments must be a JSON object');
    expect((await failure('write_file', { file_path: 'x' })).message).toContain(
      'missing required argument: content',
    );
  });

  test('a remote failure keeps the remote error type', async () => {
    const thrown = await failure('fail', { message: 'no luck' });
    expect([thrown.type, thrown.message]).toEqual(['RangeError', 'no luck']);
  });

  test('file tools work on the sandbox and report failed operations as FileOperationError', async () => {
    expect(
      await tool('write_file').invoke({ file_path: 'tools/a.txt', content: 'one\ntwo\n' }),
    ).toEqual({ path: 'tools/a.txt' });
    expect(
      await tool('edit_file').invoke({
        file_path: 'tools/a.txt',
        old_string: 'two',
        new_string: 'three',
      }),
    ).toEqual({ path: 'tools/a.txt', occurrences: 1 });
    expect(await tool('read_file').invoke({ file_path: 'tools/a.txt', offset: 1 })).toEqual({
      content: 'three',
      encoding: 'utf-8',
      totalLines: 2,
      startLine: 2,
      endLine: 2,
      nextOffset: null,
    });
    const listing = (await tool('ls').invoke({ path: 'tools' })) as {
      entries: { path: string; isDir: boolean }[];
    };
    expect(listing.entries.map((e) => [e.path, e.isDir])).toEqual([
      ['/home/user/tools/a.txt', false],
    ]);
    const globbed = (await tool('glob').invoke({ pattern: '*.txt', path: 'tools' })) as {
      matches: { path: string }[];
    };
    expect(globbed.matches.map((m) => m.path)).toEqual(['/home/user/tools/a.txt']);
    expect(await tool('grep').invoke({ pattern: 'thr', path: 'tools' })).toEqual({
      matches: [{ path: '/home/user/tools/a.txt', line: 2, text: 'three' }],
      truncated: false,
    });
    expect(await tool('execute').invoke({ command: 'cat tools/a.txt; exit 3' })).toEqual({
      output: 'one\nthree\n',
      exitCode: 3,
      truncated: false,
    });
    const missing = await failure('read_file', { file_path: 'tools/none.txt' });
    expect(missing.type).toBe('FileOperationError');
    expect(missing.message).toContain('tools/none.txt');
    const notOnce = await failure('edit_file', {
      file_path: 'tools/a.txt',
      old_string: 'absent',
      new_string: 'x',
    });
    expect(notOnce.type).toBe('FileOperationError');
  });

  test('options pick the file tools; any BaseSandbox gets them, without commands', async () => {
    expect(
      (await sandbox.tools({ fileTools: ['read_file'], commands: false, code: false })).map(
        (t) => t.name,
      ),
    ).toEqual(['read_file']);
    const root = await mkdtemp(join(tmpdir(), 'abx-tools-'));
    try {
      const local = new LocalShellSandbox({ root });
      const localTools = await sandboxTools(local);
      expect(localTools.map((t) => t.name)).toEqual([...FILE_TOOL_NAMES]);
      await callTool(localTools, 'write_file', { file_path: 'x.txt', content: 'hi' });
      expect(await callTool(localTools, 'execute', { command: 'cat x.txt' })).toEqual({
        ok: true,
        result: { output: 'hi', exitCode: 0, truncated: false },
      });
      // A custom command may not hide a file tool.
      const clash = Object.assign(local, {
        listCommands: async () => [
          { name: 'ls', description: '', args: [], source: 'yaml' as const },
        ],
        run: async () => null,
      });
      await expect(sandboxTools(clash)).rejects.toThrow(CommandDefinitionError);
      expect((await sandboxTools(clash, { fileTools: ['read_file'] })).map((t) => t.name)).toEqual([
        'ls',
        'read_file',
      ]);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});

describe('adapters', () => {
  test('OpenAI (Chat Completions and Responses) and Anthropic tool formats', () => {
    const add = tool('add');
    const read = tool('read_file');
    // `add` has an optional argument (y = 2): strict mode, which has no optional properties,
    // would make the model always send it, so it is off.
    expect(toOpenAITools([add])).toEqual([
      {
        type: 'function',
        function: {
          name: 'add',
          description: 'Add two numbers',
          parameters: add.parameters,
          strict: false,
        },
      },
    ]);
    expect(toOpenAIResponsesTools([add])).toEqual([
      {
        type: 'function',
        name: 'add',
        description: 'Add two numbers',
        parameters: add.parameters,
        strict: false,
      },
    ]);
    expect(toAnthropicTools([add])).toEqual([
      { name: 'add', description: 'Add two numbers', input_schema: add.parameters },
    ]);
    // Strict where every property is required and no others are allowed.
    const allRequired = tools.filter(
      (t) => Object.keys(t.parameters.properties).length === t.parameters.required.length,
    );
    expect(allRequired.length).toBeGreaterThan(0);
    for (const t of toOpenAIResponsesTools(tools)) {
      expect(t.strict, t.name).toBe(allRequired.some((a) => a.name === t.name));
    }
    expect(read.parameters.required).toEqual(['file_path']);
    // The APIs send the tools as JSON: the shapes must survive it.
    expect(JSON.parse(JSON.stringify(toOpenAITools(tools)))).toEqual(toOpenAITools(tools));
    expect(JSON.parse(JSON.stringify(toOpenAIResponsesTools(tools)))).toEqual(
      toOpenAIResponsesTools(tools),
    );
  });

  test('Vercel AI SDK: a Standard Schema with its JSON Schema, and an execute that runs the tool', async () => {
    const ai = toVercelAITools(tools);
    expect(Object.keys(ai)).toEqual(tools.map((t) => t.name));
    const add = ai.add;
    if (!add) throw new Error('no add');
    expect(add.description).toBe('Add two numbers');
    const standard = add.inputSchema['~standard'];
    expect(standard.version).toBe(1);
    expect(standard.jsonSchema.input({ target: 'draft-07' })).toEqual(tool('add').parameters);
    expect(standard.validate({ x: 1 })).toEqual({ value: { x: 1 } });
    expect(standard.validate('x')).toEqual({
      issues: [{ message: 'tool arguments must be a JSON object' }],
    });
    expect(await add.execute({ x: 1, y: 1 })).toBe(2);
    await expect(add.execute({ x: 'a' })).rejects.toThrow(ToolCallError);
    // An older SDK's own jsonSchema() helper makes the schemas instead.
    const wrapped = toVercelAITools(tools, { jsonSchema: (schema) => ({ wrapped: schema }) });
    expect(wrapped.add?.inputSchema).toEqual({ wrapped: tool('add').parameters });
  });

  test('callTool never rejects: results and { error, type }', async () => {
    expect(await callTool(tools, 'add', { x: 1 })).toEqual({ ok: true, result: 3 });
    expect(await callTool(tools, 'fail', { message: 'm' })).toEqual({
      ok: false,
      error: 'm',
      type: 'RangeError',
    });
    expect(await callTool(tools, 'nope', {})).toMatchObject({
      ok: false,
      type: 'ToolNotFoundError',
    });
  });
});
