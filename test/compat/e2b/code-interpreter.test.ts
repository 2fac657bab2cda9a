import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  type Context,
  NotFoundError,
  Sandbox,
  SandboxError,
  TimeoutError,
} from '@e2b/code-interpreter';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox as AbxSandbox, Templates } from '../../../src/index.js';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { type RawAnswer, rawRequest } from './raw-request.js';

// The real, unmodified `@e2b/code-interpreter` package against a real daemon and a real
// (bubblewrap) sandbox: made by its own `Sandbox.create()` (template `code-interpreter-v1`, E2B's
// control API), then driven through the daemon's gateway as one URL for every sandbox
// (`sandboxUrl`: the SDK names the sandbox and port 49999 in E2b-Sandbox-Id / -Port headers).

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let apiKey: string;
let sbx: Sandbox;
/** The sandbox's access token, as the create answer gave it to the SDK (a protected field there). */
let token: string;

const options = () => ({
  apiKey,
  apiUrl: info.apiUrl,
  sandboxUrl: info.gatewayUrl,
  requestTimeoutMs: 60_000,
});

type Raw = RawAnswer & { text: string };

/** One raw request to the gateway, addressed as `@e2b/code-interpreter` addresses port 49999. */
async function raw(
  method: string,
  path: string,
  body: Buffer | string | undefined,
  headers: Record<string, string> = { 'x-access-token': token },
  sandboxId = sbx.sandboxId,
): Promise<Raw> {
  const answer = await rawRequest(info.gatewayUrl, {
    method,
    path,
    body,
    headers: {
      // A request that names its Host goes without E2B's headers.
      ...('host' in headers ? {} : { 'e2b-sandbox-id': sandboxId, 'e2b-sandbox-port': '49999' }),
      'content-type': 'application/json',
      ...headers,
    },
  });
  return { ...answer, text: answer.body.toString('utf8') };
}

beforeAll(async () => {
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  const { readFileSync } = await import('node:fs');
  apiKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  // The package's own create: no template named, so `code-interpreter-v1`.
  sbx = await Sandbox.create(options());
  token = (sbx as unknown as { envdAccessToken: string }).envdAccessToken;
}, 300_000);

afterAll(async () => {
  await sbx?.kill().catch(() => undefined);
  await abx?.close();
}, 120_000);

describe('runCode', () => {
  test('Sandbox.create() with its default template (code-interpreter-v1) gives a sandbox with code', async () => {
    const found = await Sandbox.getInfo(sbx.sandboxId, options());
    // An alias of base (docs/e2b.md), as E2B answers a template's id rather than its alias.
    expect(found.templateId).toBe('base');
  });

  test('state lasts across cells; the main result is the last expression', async () => {
    const first = await sbx.runCode('x = 40\ndef double(n):\n    return n * 2');
    expect(first.error).toBeUndefined();
    expect(first.results).toEqual([]);
    const second = await sbx.runCode('double(x + 1) - 40');
    expect(second.text).toBe('42');
    expect(second.results[0]?.isMainResult).toBe(true);
    expect(second.executionCount).toBeGreaterThan(first.executionCount ?? 0);
  }, 120_000);

  test('stdout streams while the cell runs: the cell waits for a file the onStdout callback writes', async () => {
    const flag = `/home/user/go-${Date.now()}`;
    const seen: string[] = [];
    const execution = await sbx.runCode(
      [
        'import os, time, sys',
        "print('ready', flush=True)",
        `while not os.path.exists(${JSON.stringify(flag)}):`,
        '    time.sleep(0.05)',
        "print('done')",
        "print('to stderr', file=sys.stderr)",
      ].join('\n'),
      {
        timeoutMs: 60_000,
        onStdout: async (out) => {
          seen.push(out.line);
          // Only a line that arrives before the cell ends lets the cell end.
          if (out.line.includes('ready')) await sbx.files.write(flag, '');
        },
      },
    );
    expect(seen.join('')).toBe('ready\ndone\n');
    expect(execution.logs.stdout.join('')).toBe('ready\ndone\n');
    expect(execution.logs.stderr.join('')).toBe('to stderr\n');
    expect(execution.error).toBeUndefined();
  }, 120_000);

  test('a matplotlib figure is a PNG result', async () => {
    const execution = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()',
    );
    expect(execution.error).toBeUndefined();
    const png = execution.results.find((r) => r.png);
    expect(png?.formats()).toContain('png');
    expect(png?.isMainResult).toBe(false);
    const bytes = Buffer.from(png?.png ?? '', 'base64');
    expect(bytes.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 13, 10, 26, 10]));
  }, 120_000);

  test("a DataFrame's HTML and text", async () => {
    const execution = await sbx.runCode(
      "import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'n': [1, 2]})",
    );
    const result = execution.results[0];
    expect(result?.isMainResult).toBe(true);
    expect(result?.html).toMatch(/<table[\s\S]*Oslo[\s\S]*Lima/);
    expect(result?.text).toContain('Oslo');
    expect(result?.formats()).toContain('html');
    // Nothing but E2B's own fields: `extra` collects what the SDK does not know.
    expect(result?.extra).toEqual({});
  }, 120_000);

  test('an error in a cell: name, value and traceback; onError is called; the context goes on', async () => {
    const errors: string[] = [];
    const execution = await sbx.runCode("print('before')\n1 / 0", {
      onError: (error) => {
        errors.push(error.name);
      },
    });
    expect(execution.logs.stdout).toEqual(['before\n']);
    expect(execution.error).toMatchObject({ name: 'ZeroDivisionError', value: 'division by zero' });
    expect(execution.error?.traceback).toContain('ZeroDivisionError');
    expect(errors).toEqual(['ZeroDivisionError']);
    expect((await sbx.runCode('x')).text).toBe('40');
  }, 120_000);

  test('env_vars reach the cell', async () => {
    const execution = await sbx.runCode("import os\nos.environ['GREETING']", {
      envs: { GREETING: 'hej' },
    });
    expect(execution.text).toBe("'hej'");
  }, 120_000);

  test('javascript and bash by language', async () => {
    expect((await sbx.runCode('const a = 20; a + 22', { language: 'js' })).text).toBe('42');
    expect((await sbx.runCode('a * 2', { language: 'javascript' })).text).toBe('40');
    const bash = await sbx.runCode('V=7; echo "v=$V"', { language: 'bash' });
    expect(bash.logs.stdout.join('')).toBe('v=7\n');
    expect((await sbx.runCode('echo "again $V"', { language: 'bash' })).logs.stdout).toEqual([
      'again 7\n',
    ]);
  }, 120_000);

  test("the SDK's timeoutMs ends the cell: TimeoutError, the cell is interrupted, state stays", async () => {
    const error = await sbx
      .runCode("import time\nprint('start', flush=True)\ntime.sleep(40)\nlate = 1", {
        timeoutMs: 2000,
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TimeoutError);
    // Cells of a context run one at a time: had the cell not been interrupted, this one would
    // wait for it and see `late`.
    expect((await sbx.runCode("'late' in globals(), x")).text).toBe('(False, 40)');
  }, 120_000);
});

describe('code contexts', () => {
  test('create (cwd, language), list, isolation, restart loses state, remove', async () => {
    const context = await sbx.createCodeContext({ cwd: '/tmp' });
    expect(context).toEqual({ id: expect.any(String), language: 'python', cwd: '/tmp' });
    expect((await sbx.runCode('import os\nos.getcwd()', { context })).text).toBe("'/tmp'");
    await sbx.runCode('y = "mine"', { context });
    expect((await sbx.runCode('y', { context })).text).toBe("'mine'");
    // The default context does not see it.
    expect((await sbx.runCode('y')).error?.name).toBe('NameError');

    const listed = await sbx.listCodeContexts();
    expect(listed).toContainEqual(context);
    expect(listed.every((c: Context) => Object.keys(c).sort().join() === 'cwd,id,language')).toBe(
      true,
    );

    await sbx.restartCodeContext(context);
    const after = await sbx.runCode('y', { context });
    expect(after.error?.name).toBe('NameError');
    expect((await sbx.runCode('import os\nos.getcwd()', { context })).text).toBe("'/tmp'");

    await sbx.removeCodeContext(context.id);
    expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(context.id);
    await expect(sbx.runCode('1', { context })).rejects.toThrow(NotFoundError);
  }, 180_000);

  test('a javascript context', async () => {
    const context = await sbx.createCodeContext({ language: 'javascript' });
    expect(context.language).toBe('javascript');
    await sbx.runCode('let n = 5', { context });
    expect((await sbx.runCode('n * 3', { context })).text).toBe('15');
    await sbx.removeCodeContext(context);
  }, 120_000);
});

describe('bad input', () => {
  test('an unknown context: NotFoundError from runCode, restart and remove', async () => {
    const ghost = { id: 'no-such-context', language: 'python', cwd: '/home/user' };
    const run = await sbx.runCode('1', { context: ghost }).catch((e: unknown) => e);
    expect(run).toBeInstanceOf(NotFoundError);
    expect((run as Error).message).toContain('no-such-context');
    await expect(sbx.restartCodeContext(ghost)).rejects.toThrow(NotFoundError);
    await expect(sbx.removeCodeContext('no-such-context')).rejects.toThrow(NotFoundError);
  }, 60_000);

  test('a language abx does not run: a SandboxError naming it and the ones it runs', async () => {
    for (const language of ['r', 'typescript', 'java']) {
      const error = await sbx.runCode('1', { language }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SandboxError);
      expect((error as Error).message).toContain(`language "${language}" is not run by abx`);
      expect((error as Error).message).toContain('python, javascript (js) and bash');
      await expect(sbx.createCodeContext({ language })).rejects.toThrow(/is not run by abx/);
    }
  }, 60_000);

  test('malformed JSON, wrong types, both context and language: 400 naming the problem', async () => {
    const cases: [string, string, RegExp][] = [
      ['/execute', '{"code": ', /not JSON/],
      ['/execute', '[1]', /must be a JSON object, not an array/],
      ['/execute', '{"code": 5}', /code of POST \/execute must be a string/],
      ['/execute', '{}', /code of POST \/execute must be a string .*not missing/],
      ['/execute', '{"code": "1", "context_id": 7}', /context_id .* must be a string/],
      ['/execute', '{"code": "1", "env_vars": {"A": 1}}', /env_vars.A .* must be a string/],
      [
        '/execute',
        '{"code": "1", "context_id": "a", "language": "python"}',
        /Only one of context_id or language/,
      ],
      ['/contexts', '{"language": 3}', /language of POST \/contexts must be a string/],
      ['/contexts', '{"cwd": "/no/such/dir"}', /\/no\/such\/dir/],
    ];
    for (const [path, body, message] of cases) {
      const answer = await raw('POST', path, body);
      expect({ path, body, status: answer.status }).toEqual({ path, body, status: 400 });
      expect(answer.text).toMatch(message);
      expect(answer.reason).toMatch(message);
    }
    // Nothing was made by a refused request.
    expect((await sbx.listCodeContexts()).filter((c) => c.cwd === '/no/such/dir')).toEqual([]);
  }, 60_000);

  test('a body over the limit is 413 and the daemon goes on', async () => {
    const huge = JSON.stringify({ code: `# ${'x'.repeat(5 * 1024 * 1024)}` });
    const answer = await raw('POST', '/execute', huge);
    expect(answer.status).toBe(413);
    expect((await sbx.runCode('x')).text).toBe('40');
  }, 60_000);

  test('no token, or a wrong one: 401; the traffic token alone is enough (as the SDK sends it)', async () => {
    expect((await raw('GET', '/contexts', undefined, {})).status).toBe(401);
    expect((await raw('GET', '/contexts', undefined, { 'x-access-token': 'wrong' })).status).toBe(
      401,
    );
    const traffic = await raw('GET', '/contexts', undefined, {
      'e2b-traffic-access-token': token,
    });
    expect(traffic.status).toBe(200);
    expect(Array.isArray(JSON.parse(traffic.text))).toBe(true);
  }, 60_000);

  test('arbitrary bytes and JSON as bodies: a 400 (or a cell that ran), and the daemon goes on', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.uint8Array({ maxLength: 300 }).map((bytes) => Buffer.from(bytes)),
          fc.json().map((text) => Buffer.from(text)),
          fc
            .record({ code: fc.oneof(fc.string(), fc.integer()), language: fc.string() })
            .map((body) => Buffer.from(JSON.stringify(body))),
        ),
        fc.constantFrom('/execute', '/contexts'),
        async (body, path) => {
          const answer = await raw('POST', path, body);
          expect([200, 400]).toContain(answer.status);
          if (answer.status === 400) expect(answer.text.length).toBeGreaterThan(0);
        },
      ),
      { numRuns: 80, seed: 27 },
    );
    expect((await sbx.runCode('x')).text).toBe('40');
  }, 120_000);

  test('Host 49999-{id}.{domain} without E2B headers reaches the code interpreter too', async () => {
    const answer = await raw('GET', '/contexts', undefined, {
      'x-access-token': token,
      host: `49999-${sbx.sandboxId}.${info.domain}`,
    });
    expect(answer.status).toBe(200);
    expect(JSON.parse(answer.text)).toContainEqual(expect.objectContaining({ language: 'python' }));
  }, 60_000);

  test('an unknown route or method of port 49999 answers what is served', async () => {
    const answer = await raw('GET', '/kernels', undefined);
    expect(answer.status).toBe(404);
    expect(answer.text).toContain('POST /execute');
    expect((await raw('PUT', '/contexts', '{}')).status).toBe(405);
    expect((await raw('GET', '/health', undefined)).text).toBe('"OK"');
  }, 60_000);

  test('a template without code: refused with the capability error; a sandbox that is gone: TimeoutError', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'abx-ci-tpl-'));
    try {
      const yaml = join(dir, 'template.yaml');
      await writeFile(yaml, 'name: no-code\ncapabilities: [shell, files]\n');
      await Templates.build(yaml, { home: abx.home });
      const plain = await AbxSandbox.create({ home: abx.home, template: 'no-code' });
      try {
        const answer = await raw(
          'POST',
          '/execute',
          '{"code": "1"}',
          { 'x-access-token': plain.accessToken },
          plain.sandboxId,
        );
        expect(answer.status).toBe(403);
        expect(answer.text).toContain("template 'no-code' does not have the code capability");
      } finally {
        await plain.kill();
      }
      // The SDK's object for a sandbox that is gone: E2B's proxy answers 502, the SDK's TimeoutError.
      const gone = await Sandbox.create(options());
      await gone.kill();
      await expect(gone.runCode('1')).rejects.toThrow(TimeoutError);
      await expect(gone.listCodeContexts()).rejects.toThrow(TimeoutError);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }, 180_000);
});
