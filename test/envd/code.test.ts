import { copyFileSync, existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildSync } from 'esbuild';
import { request } from 'undici';
import { afterAll, test as base, describe, expect } from 'vitest';
import { codeGroup } from '../../runtime/envd/code.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { PROCESS } from '../../runtime/server/groups/process.js';
import { SandboxServer } from '../../runtime/server/server.js';
import {
  type Answer,
  type CallOptions,
  call,
  eventually,
  isAlive,
  ROOT,
} from '../server/harness.js';
import { type Event, lines } from './harness.js';

// Sandboxes run Debian's python3 (where apt puts matplotlib and pandas); a developer's PATH may
// put another one first.
process.env.PATH = `/usr/bin:/bin:${process.env.PATH ?? ''}`;

/** The drivers as the build ships them: python_driver.py copied, js_driver bundled. */
const driversDir = mkdtempSync(join(tmpdir(), 'abx-code-drivers-'));
copyFileSync(
  join(ROOT, 'runtime/envd/code/python_driver.py'),
  join(driversDir, 'python_driver.py'),
);
buildSync({
  entryPoints: [join(ROOT, 'runtime/envd/code/js_driver.ts')],
  outfile: join(driversDir, 'js_driver.cjs'),
  bundle: true,
  platform: 'node',
  format: 'cjs',
  logLevel: 'error',
});
afterAll(() => rmSync(driversDir, { recursive: true, force: true }));

const TOKEN = 'code-test-token';

interface CodeUnderTest {
  server: SandboxServer;
  url: string;
  call(path: string, options?: CallOptions): Promise<Answer>;
  /** Opens `POST /execute`; its events one by one, as they arrive. */
  open(body: unknown): Promise<AsyncIterator<Event>>;
  /** Every event of one `POST /execute`. */
  run(body: unknown): Promise<Event[]>;
}

/** A server with envd's CODE group, stopped after each test (which kills its interpreters). */
const test = base.extend<{ code: CodeUnderTest }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  code: async ({}, use) => {
    const server = new SandboxServer({
      token: TOKEN,
      catalog: [CORE, PROCESS, codeGroup({ driversDir })],
    });
    const { host, port } = await server.start();
    const url = `http://${host}:${port}`;
    const open = async (body: unknown) => {
      const response = await request(`${url}/execute`, {
        method: 'POST',
        headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      if (response.statusCode !== 200) {
        throw new Error(`/execute answered ${response.statusCode}: ${await response.body.text()}`);
      }
      expect(response.headers['content-type']).toMatch(/^application\/x-ndjson/);
      return lines(response.body)[Symbol.asyncIterator]();
    };
    try {
      await use({
        server,
        url,
        call: (path, options = {}) => call(url, path, { token: TOKEN, ...options }),
        open,
        run: async (body) => {
          const all: Event[] = [];
          const iterator = await open(body);
          for (let next = await iterator.next(); !next.done; next = await iterator.next()) {
            all.push(next.value);
          }
          return all;
        },
      });
    } finally {
      await server.stop();
    }
  },
});

const text = (events: Event[], type: 'stdout' | 'stderr') =>
  events
    .filter((e) => e.type === type)
    .map((e) => e.text)
    .join('');
const main = (events: Event[]) => events.find((e) => e.type === 'result' && e.is_main_result);
const errorOf = (events: Event[]) => events.find((e) => e.type === 'error');

async function newContext(code: CodeUnderTest, language = 'python'): Promise<string> {
  const { status, json } = await code.call('/contexts', { body: { language } });
  expect(status).toBe(200);
  return json.id;
}

describe('Python contexts', () => {
  test('state persists across cells; the last expression is the main result', async ({ code }) => {
    const first = await code.run({ code: 'x = 40\nimport math\ndef f(y):\n    return y + 1' });
    expect(first).toEqual([{ type: 'end', execution_count: 1 }]);
    const second = await code.run({ code: 'f(x) + 1' });
    expect(main(second)).toMatchObject({ text: '42' });
    expect(second.at(-1)).toEqual({ type: 'end', execution_count: 2 });
    expect(main(await code.run({ code: '1+1' }))).toEqual({
      type: 'result',
      is_main_result: true,
      text: '2',
    });
    expect(main(await code.run({ code: 'print("no value")\nNone' }))).toBeUndefined();
  });

  test('a matplotlib figure becomes a PNG of its size in pixels', async ({ code }) => {
    const events = await code.run({
      code: 'import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(3, 2), dpi=50)\nplt.plot([1, 3, 2])\nplt.show()',
    });
    const pngs = events.filter((e) => e.type === 'result' && e.png);
    expect(pngs).toHaveLength(1);
    expect(pngs[0].is_main_result).toBe(false);
    const png = Buffer.from(pngs[0].png, 'base64');
    expect(png.subarray(0, 8)).toEqual(Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]));
    expect(png.subarray(12, 16).toString('ascii')).toBe('IHDR');
    expect([png.readUInt32BE(16), png.readUInt32BE(20)]).toEqual([150, 100]);
    // Shown figures are closed: the next cell emits none.
    const next = await code.run({ code: 'len(plt.get_fignums())' });
    expect(next.filter((e) => e.png)).toEqual([]);
    expect(main(next).text).toBe('0');
  });

  test('a DataFrame has html and text; display() emits a result that is not the main one', async ({
    code,
  }) => {
    const events = await code.run({
      code: 'import pandas as pd\ndisplay("shown")\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})',
    });
    expect(events[0]).toMatchObject({ type: 'result', is_main_result: false, text: "'shown'" });
    expect(main(events).html).toContain('<table');
    expect(main(events).text).toContain('a  b');
  });

  test('stdout and stderr arrive interleaved in the order written', async ({ code }) => {
    const events = await code.run({
      code: 'import sys, os\nprint("one")\nprint("two", file=sys.stderr)\nprint("three")\nos.system("echo four; echo five >&2")\nprint("six")',
    });
    const output = events
      .filter((e) => e.type === 'stdout' || e.type === 'stderr')
      .map((e) => `${e.type}:${e.text}`);
    expect(output.slice(0, 6).join('')).toBe(
      'stdout:onestdout:\nstderr:twostderr:\nstdout:threestdout:\n',
    );
    // A subprocess writes to two pipes, so only the order within each is known; all of it
    // comes before what Python prints after it.
    expect(output.slice(6, 8).sort()).toEqual(['stderr:five\n', 'stdout:four\n']);
    expect(output.slice(8).join('')).toBe('stdout:sixstdout:\n');
    expect(events.at(-1).type).toBe('end');
  });

  test('an exception is an error event and the context goes on', async ({ code }) => {
    const events = await code.run({
      code: 'y = 1\ndef g():\n    raise ValueError("bad value")\ng()',
    });
    const error = errorOf(events);
    expect(error).toMatchObject({ name: 'ValueError', value: 'bad value' });
    expect(error.traceback).toContain('raise ValueError("bad value")');
    expect(error.traceback).not.toContain('python_driver');
    expect(main(await code.run({ code: 'y + 1' })).text).toBe('2');
    const syntax = errorOf(await code.run({ code: 'def (' }));
    expect(syntax.name).toBe('SyntaxError');
  });

  test('events stream while the cell runs', async ({ code }) => {
    const started = Date.now();
    const iterator = await code.open({
      code: 'import time\nprint("first")\ntime.sleep(1)\nprint("second")',
    });
    const first = await iterator.next();
    expect(first.value).toEqual({ type: 'stdout', text: 'first' });
    expect(Date.now() - started).toBeLessThan(900);
    const rest: Event[] = [];
    for (let next = await iterator.next(); !next.done; next = await iterator.next()) {
      rest.push(next.value);
    }
    expect(text(rest, 'stdout')).toBe('\nsecond\n');
    expect(Date.now() - started).toBeGreaterThanOrEqual(1000);
  });

  test('a cell past its timeout is interrupted and the context keeps its state', async ({
    code,
  }) => {
    const id = await newContext(code);
    await code.run({ code: 'kept = "yes"', context_id: id });
    const events = await code.run({ code: 'while True: pass', context_id: id, timeout_ms: 1000 });
    expect(errorOf(events)).toMatchObject({ name: 'TimeoutError' });
    expect(errorOf(events).value).toContain('1000 ms');
    expect(events.at(-1)).toMatchObject({ type: 'end', execution_count: 2 });
    expect(main(await code.run({ code: 'kept', context_id: id })).text).toBe("'yes'");
  });

  test('a client that goes away interrupts its cell; the context keeps its state', async ({
    code,
  }) => {
    const id = await newContext(code);
    await code.run({ code: 'kept = 7', context_id: id });
    const aborted = new AbortController();
    const response = await request(`${code.url}/execute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        code: 'import time\nprint("busy", flush=True)\nwhile True: time.sleep(0.05)',
        context_id: id,
        timeout_ms: 0,
      }),
      signal: aborted.signal,
    });
    const first = await lines(response.body)[Symbol.asyncIterator]().next();
    expect(first.value).toEqual({ type: 'stdout', text: 'busy' });
    aborted.abort();
    // Without the interrupt this cell would wait forever behind the endless one (the test's
    // timeout would end it).
    expect(main(await code.run({ code: 'kept', context_id: id })).text).toBe('7');
  });

  test('a client that reads slowly holds the cell back; nothing is lost', async ({ code }) => {
    const id = await newContext(code);
    const marker = join(driversDir, `written-${id}`);
    // 48 MiB of output, far past what envd holds for a client (8 MiB) and the pipes and socket
    // buffers between: the cell can only finish once the client has read most of it.
    const response = await request(`${code.url}/execute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        code: `line = "x" * 1023\nfor i in range(48 * 1024): print(line)\nopen(${JSON.stringify(marker)}, "w").close()`,
        context_id: id,
        timeout_ms: 0,
      }),
    });
    await new Promise((resolve) => setTimeout(resolve, 1500));
    expect(existsSync(marker)).toBe(false);
    let bytes = 0;
    let last: Event;
    for await (const event of lines(response.body)) {
      if (event.type === 'stdout') bytes += event.text.length;
      last = event;
    }
    expect(bytes).toBe(48 * 1024 * 1024);
    expect(last).toMatchObject({ type: 'end' });
    expect(existsSync(marker)).toBe(true);
    expect(main(await code.run({ code: '1 + 1', context_id: id })).text).toBe('2');
  });

  test('contexts are isolated; restart clears state; delete forgets', async ({ code }) => {
    const a = await newContext(code);
    const b = await newContext(code);
    await code.run({ code: 'v = "a"', context_id: a });
    expect(errorOf(await code.run({ code: 'v', context_id: b })).name).toBe('NameError');
    const listed = await code.call('/contexts');
    expect(listed.json.contexts.map((c: Event) => c.id)).toEqual([a, b]);
    const restarted = await code.call(`/contexts/${a}/restart`, { method: 'POST' });
    expect(restarted.json).toMatchObject({ id: a, language: 'python', alive: true });
    expect(errorOf(await code.run({ code: 'v', context_id: a })).name).toBe('NameError');
    expect((await code.call(`/contexts/${b}`, { method: 'DELETE' })).status).toBe(200);
    const gone = await code.call('/execute', { body: { code: '1', context_id: b } });
    expect(gone.status).toBe(404);
  });

  test('a dead interpreter is a clear error until the context is restarted', async ({ code }) => {
    const id = await newContext(code);
    const died = await code.run({ code: 'import os\nos._exit(3)', context_id: id });
    expect(errorOf(died)).toMatchObject({ name: 'ContextDeadError' });
    expect(errorOf(died).value).toContain('restart');
    expect(died.at(-1).type).toBe('end');
    const refused = await code.call('/execute', { body: { code: '1', context_id: id } });
    expect(refused.status).toBe(409);
    expect(refused.json).toMatchObject({ type: 'ContextDeadError' });
    expect(refused.json.error).toContain(`/contexts/${id}/restart`);
    expect((await code.call('/contexts')).json.contexts[0].alive).toBe(false);
    await code.call(`/contexts/${id}/restart`, { method: 'POST' });
    expect(main(await code.run({ code: '6*7', context_id: id })).text).toBe('42');
  });

  test('a killed interpreter, too', async ({ code }) => {
    const id = await newContext(code);
    const pid = main(await code.run({ code: 'import os\nos.getpid()', context_id: id })).text;
    process.kill(Number(pid), 'SIGKILL');
    await eventually(async () => (await code.call('/contexts')).json.contexts[0].alive === false);
    const refused = await code.call('/execute', { body: { code: '1', context_id: id } });
    expect(refused.json.error).toMatch(/killed by SIGKILL/);
  });

  test('bad requests: context_id with language, an unknown language, no python3', async ({
    code,
  }) => {
    const both = await code.call('/execute', {
      body: { code: '1', context_id: 'ctx1', language: 'python' },
    });
    expect(both.status).toBe(400);
    const unknown = await code.call('/contexts', { body: { language: 'cobol' } });
    expect(unknown.status).toBe(400);
    const path = process.env.PATH;
    process.env.PATH = '/nonexistent';
    try {
      const missing = await code.call('/contexts', { body: { language: 'python' } });
      expect(missing.status).toBe(503);
      expect(missing.json).toMatchObject({ type: 'ToolUnavailableError' });
      expect(missing.json.error).toMatch(/python3.*template/);
    } finally {
      process.env.PATH = path;
    }
  });

  test('the server’s stop kills the interpreters', async ({ code }) => {
    const pid = Number(main(await code.run({ code: 'import os\nos.getpid()' })).text);
    expect(isAlive(pid)).toBe(true);
    await code.server.stop();
    await eventually(() => !isAlive(pid));
  });
});

describe('JavaScript and bash contexts', () => {
  test('JavaScript keeps state; console output and errors are events', async ({ code }) => {
    const id = await newContext(code, 'javascript');
    await code.run({ code: 'var n = 20; function twice(x) { return 2 * x; }', context_id: id });
    const events = await code.run({
      code: 'console.log("hi", 1); console.error("oops"); twice(n) + 2',
      context_id: id,
    });
    expect(text(events, 'stdout')).toBe('hi 1\n');
    expect(text(events, 'stderr')).toBe('oops\n');
    expect(main(events).text).toBe('42');
    const thrown = await code.run({ code: 'null.x', context_id: id });
    expect(errorOf(thrown)).toMatchObject({ name: 'TypeError' });
    const spin = await code.run({ code: 'for (;;) {}', context_id: id, timeout_ms: 500 });
    expect(errorOf(spin)).toMatchObject({ name: 'TimeoutError' });
    expect(main(await code.run({ code: 'Promise.resolve(n)', context_id: id })).text).toBe('20');
    expect(main(await code.run({ code: '({ a: [1, 2] })', language: 'javascript' })).text).toBe(
      '{ a: [ 1, 2 ] }',
    );
  });

  test('JavaScript: top-level await; what an await cell declares persists', async ({ code }) => {
    const id = await newContext(code, 'javascript');
    const run = (cell: string, timeout_ms?: number) =>
      code.run({ code: cell, context_id: id, timeout_ms });
    const cell = 'const r = await Promise.resolve(5); r * 2';
    expect(main(await run(cell)).text).toBe('10');
    // Run again, as in a notebook: the const of an await cell can be declared again.
    expect(main(await run(cell)).text).toBe('10');
    const slept = await run(
      'const t0 = Date.now()\nawait new Promise((resolve) => setTimeout(resolve, 100))\nconsole.log("slept")\nDate.now() - t0 >= 100',
    );
    expect(text(slept, 'stdout')).toBe('slept\n');
    expect(main(slept).text).toBe('true');
    const declared = await run(
      [
        'let a = 1, { b, c: [d] } = { b: 2, c: [3] }',
        'var v = await Promise.resolve(4)',
        'function f(x) { return x + a }',
        "class K { get k() { return 'k' } }",
        'async function twice(x) { return 2 * x }',
        '// the last statement is a declaration: no result',
        'const last = await f(1)',
      ].join('\n'),
    );
    expect(declared).toEqual([{ type: 'end', execution_count: 4 }]);
    expect(
      main(await run('[r, a, b, d, v, f(1), new K().k, last, await twice(3)].join(" ")')).text,
    ).toBe("'5 1 2 3 4 2 k 2 6'");
    // Without await, let/const persist as script declarations (as before).
    await run('let plain = 40');
    expect(main(await run('plain + (await Promise.resolve(2))')).text).toBe('42');
    const rejected = await run('await null\nawait Promise.reject(new RangeError("nope"))');
    expect(errorOf(rejected)).toMatchObject({ name: 'RangeError', value: 'nope' });
    expect(errorOf(rejected).traceback).toContain('<cell 8>:2');
    expect(errorOf(rejected).traceback).not.toContain('js_driver');
    // A typo after an await is reported as such, not as an await outside an async function.
    const typo = await run('await 1; syntax error');
    expect(errorOf(typo)).toMatchObject({
      name: 'SyntaxError',
      value: "Unexpected identifier 'error'",
    });
  });

  test('JavaScript: a timeout interrupts an await and a loop; the context keeps its state', async ({
    code,
  }) => {
    const id = await newContext(code, 'javascript');
    await code.run({ code: 'const kept = await Promise.resolve("yes")', context_id: id });
    const waiting = await code.run({
      code: 'await new Promise(() => {})',
      context_id: id,
      timeout_ms: 500,
    });
    expect(errorOf(waiting)).toMatchObject({ name: 'TimeoutError' });
    const spin = await code.run({
      code: 'for (;;) {}\nawait 1',
      context_id: id,
      timeout_ms: 500,
    });
    expect(errorOf(spin)).toMatchObject({ name: 'TimeoutError' });
    const never = await code.run({
      code: 'Promise.resolve(kept).then(() => new Promise(() => {}))',
      context_id: id,
      timeout_ms: 500,
    });
    expect(errorOf(never)).toMatchObject({ name: 'TimeoutError' });
    expect(main(await code.run({ code: 'kept', context_id: id })).text).toBe("'yes'");
  });

  test('bash keeps variables and cwd; a timeout interrupts without killing the shell', async ({
    code,
  }) => {
    const id = await newContext(code, 'bash');
    await code.run({ code: 'name=world\ncd /tmp', context_id: id });
    const events = await code.run({
      code: 'echo "hello $name"; echo err >&2; printf "no newline"',
      context_id: id,
    });
    expect(text(events, 'stdout')).toBe('hello world\nno newline');
    expect(text(events, 'stderr')).toBe('err\n');
    expect(text(await code.run({ code: 'pwd', context_id: id }), 'stdout')).toBe('/tmp\n');
    const failed = await code.run({ code: 'false', context_id: id });
    expect(errorOf(failed)).toMatchObject({ name: 'ExitStatus', value: 'exit status 1' });
    const slow = await code.run({ code: 'sleep 30; echo never', context_id: id, timeout_ms: 500 });
    expect(errorOf(slow)).toMatchObject({ name: 'TimeoutError' });
    expect(text(slow, 'stdout')).toBe('');
    const spin = await code.run({ code: 'while :; do :; done', context_id: id, timeout_ms: 500 });
    expect(errorOf(spin)).toMatchObject({ name: 'TimeoutError' });
    expect(text(await code.run({ code: 'echo $name', context_id: id }), 'stdout')).toBe('world\n');
  });

  test('bash cells run at the top level: declare makes globals, a function keeps its locals', async ({
    code,
  }) => {
    const id = await newContext(code, 'bash');
    const first = await code.run({
      code: 'declare x=1\ndeclare -A m=([a]=apple [b]=banana)\ndeclare -i n=6*7\ntypeset t=typed\nf() { declare inner=1; local y=2; g=3; }\nf',
      context_id: id,
    });
    // Nothing of what bash prints when it starts (no job control, its prompt) reaches a cell.
    expect(first).toEqual([{ type: 'end', execution_count: 1 }]);
    const second = await code.run({
      code: 'echo "$x ${m[b]} $n $t [${inner-}] [${y-}] $g"',
      context_id: id,
    });
    expect(second).toEqual([
      { type: 'stdout', text: '1 banana 42 typed [] [] 3\n' },
      { type: 'end', execution_count: 2 },
    ]);
    expect(text(await code.run({ code: 'declare -p m', context_id: id }), 'stdout')).toMatch(
      /^declare -A m=\(/,
    );
  });

  test('bash: multi-line cells, syntax errors, background jobs and interrupts', async ({
    code,
  }) => {
    const id = await newContext(code, 'bash');
    const multi = await code.run({
      code: [
        'greet() {',
        '  echo "hi $1!"',
        '}',
        'for i in 1 2; do',
        '  if [ "$i" = 2 ]; then greet "$i"; fi',
        'done',
        "cat <<'EOF'",
        'a $literal here-doc',
        'EOF',
        'read -r line || echo "stdin is empty"',
      ].join('\n'),
      context_id: id,
    });
    expect(text(multi, 'stdout')).toBe('hi 2!\na $literal here-doc\nstdin is empty\n');
    expect(errorOf(multi)).toBeUndefined();
    expect(text(await code.run({ code: 'greet again', context_id: id }), 'stdout')).toBe(
      'hi again!\n',
    );
    // Like a script: the lines before the one bash cannot parse have run.
    const syntax = await code.run({ code: 'kept=yes\nif true; then', context_id: id });
    expect(errorOf(syntax)).toMatchObject({ name: 'ExitStatus', value: 'exit status 2' });
    expect(text(syntax, 'stderr')).toMatch(/syntax error/);
    // A background job is not announced (no "[1] 1234"), and output stays in its stream.
    const background = await code.run({
      code: 'sleep 0.1 &\nwait\necho done; echo oops >&2',
      context_id: id,
    });
    expect(background.filter((e) => e.type !== 'end')).toEqual([
      { type: 'stdout', text: 'done\n' },
      { type: 'stderr', text: 'oops\n' },
    ]);
    // The interrupt aborts the whole cell, not just the loop that runs.
    const spin = await code.run({
      code: 'spin() { while :; do :; done; }\nspin; spin; echo never',
      context_id: id,
      timeout_ms: 500,
    });
    expect(errorOf(spin)).toMatchObject({ name: 'TimeoutError' });
    expect(spin.filter((e) => e.type === 'stdout' || e.type === 'stderr')).toEqual([]);
    const after = await code.run({ code: 'echo "$kept"; spin() { :; }; spin', context_id: id });
    expect(after).toEqual([
      { type: 'stdout', text: 'yes\n' },
      { type: 'end', execution_count: 6 },
    ]);
    const exited = await code.run({ code: 'exit 3', context_id: id });
    expect(errorOf(exited)).toMatchObject({ name: 'ContextDeadError' });
  });

  test('bash falls back to sh: state persists, errors and timeouts keep the shell', async ({
    code,
  }) => {
    const bin = mkdtempSync(join(tmpdir(), 'abx-sh-only-'));
    symlinkSync('/bin/sh', join(bin, 'sh'));
    const path = process.env.PATH;
    process.env.PATH = bin;
    let id: string;
    try {
      id = await newContext(code, 'bash');
    } finally {
      process.env.PATH = path;
      rmSync(bin, { recursive: true, force: true });
    }
    const listed = await code.call('/process');
    expect(listed.json.processes.map((p: Event) => p.command)).toContain(
      `${bin}/sh (code context ${id})`,
    );
    await code.run({ code: 'x=5\ncd /tmp', context_id: id });
    const events = await code.run({ code: 'echo "$x $(pwd)"; echo err >&2', context_id: id });
    expect(text(events, 'stdout')).toBe('5 /tmp\n');
    expect(text(events, 'stderr')).toBe('err\n');
    const syntax = await code.run({ code: 'if true; then', context_id: id });
    expect(errorOf(syntax)).toMatchObject({ name: 'ExitStatus', value: 'exit status 2' });
    const spin = await code.run({ code: 'while :; do :; done', context_id: id, timeout_ms: 500 });
    expect(errorOf(spin)).toMatchObject({ name: 'TimeoutError' });
    expect(text(await code.run({ code: 'echo $x', context_id: id }), 'stdout')).toBe('5\n');
  });
});
