import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { CapabilityError, type OutputMessage, Sandbox, Templates } from '../../src/index.js';
import { abxIn } from '../cli/abx.js';
import { createAbxHome } from '../helpers/abx-home.js';

// The code capability from the SDK and the CLI, in real sandboxes with Debian's python3,
// matplotlib and pandas (installed by scripts/setup-system.sh).
let abx: Awaited<ReturnType<typeof createAbxHome>>;
let box: Sandbox;
const work = mkdtempSync(join(tmpdir(), 'abx-code-'));

/** Width and height from a PNG's IHDR chunk. */
function pngSize(base64: string): [number, number] {
  const bytes = Buffer.from(base64, 'base64');
  expect(bytes.subarray(0, 8)).toEqual(Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]));
  return [bytes.readUInt32BE(16), bytes.readUInt32BE(20)];
}

beforeAll(async () => {
  abx = await createAbxHome();
  box = await Sandbox.create({ home: abx.home });
});
afterAll(async () => {
  await box?.kill().catch(() => false);
  await abx?.close();
  rmSync(work, { recursive: true, force: true });
});

describe('sandbox.runCode', () => {
  test('state persists; the last expression is the main result', async () => {
    await box.runCode('import math\nx = 20');
    const execution = await box.runCode('x += 1\nmath.floor(x * 2.0)');
    expect(execution.text).toBe('42');
    expect(execution.results).toHaveLength(1);
    expect(execution.results[0]?.formats()).toEqual(['text']);
    expect(execution.error).toBeUndefined();
    expect(execution.executionCount).toBeGreaterThanOrEqual(2);
  });

  test('output streams to the callbacks before the cell ends, in order', async () => {
    const seen: [string, number][] = [];
    const started = Date.now();
    const execution = await box.runCode(
      'import sys, time\nprint("first")\nsys.stdout.flush()\ntime.sleep(1)\nprint("oops", file=sys.stderr)\nprint("last")',
      {
        onStdout: (o: OutputMessage) => seen.push([o.line, o.timestamp - started]),
        onStderr: (o: OutputMessage) => seen.push([`err:${o.line}`, o.timestamp - started]),
      },
    );
    // Chunks as the interpreter wrote them (print writes the text, then the newline).
    const order = seen
      .map(([line]) => line.replace(/\n/g, ''))
      .filter((l) => l !== '' && l !== 'err:');
    expect(order).toEqual(['first', 'err:oops', 'last']);
    // The first line arrived while the cell still slept.
    expect((seen[0] as [string, number])[1]).toBeLessThan((seen[2] as [string, number])[1] - 500);
    expect(execution.logs.stdout.join('')).toBe('first\nlast\n');
    expect(execution.logs.stderr.join('')).toBe('oops\n');
  });

  test('a matplotlib figure is a PNG of its size; a DataFrame is HTML and text', async () => {
    const chart = await box.runCode(
      'import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=50)\nplt.plot([1, 3, 2])\nplt.show()',
    );
    const png = chart.results.find((r) => r.png);
    expect(png?.isMainResult).toBe(false);
    expect(pngSize(png?.png as string)).toEqual([200, 150]);
    const table = await box.runCode(
      'import pandas as pd\npd.DataFrame({"city": ["Oslo", "Lima"], "people": [3, 5]})',
    );
    expect(table.results[0]?.html).toContain('<table');
    expect(table.text).toContain('Oslo');
  });

  test('an exception is data; the next cell runs; a timeout keeps the state', async () => {
    const failed = await box.runCode('kept = "yes"\n1 / 0');
    expect(failed.error).toMatchObject({ name: 'ZeroDivisionError', value: 'division by zero' });
    expect(failed.error?.traceback).toContain('ZeroDivisionError');
    const timedOut = await box.runCode('while True: pass', { timeoutMs: 1000 });
    expect(timedOut.error?.name).toBe('TimeoutError');
    expect((await box.runCode('kept')).text).toBe("'yes'");
  });

  test('contexts: isolated, restartable, removable; JavaScript and bash keep state too', async () => {
    const a = await box.createCodeContext({ language: 'python' });
    const b = await box.createCodeContext({ language: 'python', cwd: '/tmp' });
    await box.runCode('secret = 7', { context: a });
    expect((await box.runCode('secret', { context: a })).text).toBe('7');
    expect((await box.runCode('secret', { context: b })).error?.name).toBe('NameError');
    expect((await box.runCode('import os; os.getcwd()', { context: b })).text).toBe("'/tmp'");
    await box.restartCodeContext(a);
    expect((await box.runCode('secret', { context: a })).error?.name).toBe('NameError');
    expect((await box.listCodeContexts()).map((c) => c.id)).toEqual(
      expect.arrayContaining([a.id, b.id]),
    );
    await box.removeCodeContext(b);
    expect((await box.listCodeContexts()).map((c) => c.id)).not.toContain(b.id);
    await expect(box.runCode('1', { context: b, language: 'python' })).rejects.toThrow(/not both/);

    await box.runCode('let n = 40', { language: 'javascript' });
    expect((await box.runCode('n + 2', { language: 'javascript' })).text).toBe('42');
    await box.runCode('export GREETING=hi; cd /tmp', { language: 'bash' });
    const bash = await box.runCode('echo "$GREETING from $(pwd)"', { language: 'bash' });
    expect(bash.logs.stdout.join('')).toBe('hi from /tmp\n');
  });

  test('run_code is a tool; abx code prints output and saves images', async () => {
    const tool = (await box.tools()).find((t) => t.name === 'run_code');
    expect(tool?.kind).toBe('code');
    expect(await tool?.invoke({ code: 'print(6 * 7)' })).toMatchObject({
      stdout: '42\n',
      error: null,
    });
    const cli = abxIn(abx.home);
    const printed = await cli.abx(['code', box.sandboxId, 'print("from the cli"); 5 + 5']);
    expect(printed).toMatchObject({ code: 0, stdout: 'from the cli\n10\n' });
    const script = join(work, 'plot.py');
    writeFileSync(
      script,
      'import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2), dpi=50)\nplt.plot([0, 1])\n',
    );
    const out = join(work, 'charts');
    const saved = await cli.abx(['code', box.sandboxId, '-f', script, '--out', out]);
    expect(saved.code).toBe(0);
    const [file] = readdirSync(out);
    expect(file).toMatch(/\.png$/);
    expect(pngSize(readFileSync(join(out, file as string)).toString('base64'))).toEqual([100, 100]);
    const failed = await cli.abx(['code', box.sandboxId, 'undefined_name']);
    expect(failed.code).toBe(1);
    expect(failed.stderr).toContain('NameError');
  });

  test('a template without code refuses code contexts with a CapabilityError', async () => {
    const yaml = join(work, 'no-code.yaml');
    writeFileSync(yaml, 'name: no-code\ncapabilities: [shell, files]\n');
    await Templates.build(yaml, { home: abx.home });
    const plain = await Sandbox.create({ home: abx.home, template: 'no-code' });
    try {
      expect((await plain.tools()).map((t) => t.name)).not.toContain('run_code');
      const error = await plain.runCode('1 + 1').catch((e) => e);
      expect(error).toBeInstanceOf(CapabilityError);
      expect(error.message).toContain("template 'no-code' does not have the code capability");
      expect((await plain.commands.run('echo still a shell')).stdout).toBe('still a shell\n');
    } finally {
      await plain.kill();
    }
  });

  test('a code-only template: no shell or files for its users, yet it can be snapshotted', async () => {
    const yaml = join(work, 'code-only.yaml');
    writeFileSync(yaml, 'name: code-only\ncapabilities: [code]\n');
    await Templates.build(yaml, { home: abx.home });
    const only = await Sandbox.create({ home: abx.home, template: 'code-only' });
    try {
      await only.runCode("open('kept.txt', 'w').write('from a cell')");
      for (const attempt of [
        () => only.commands.run('echo no'),
        () => only.files.read('kept.txt'),
        () => only.files.write('other.txt', 'no'),
      ]) {
        const error = await attempt().catch((e) => e);
        expect(error).toBeInstanceOf(CapabilityError);
        expect(error.message).toMatch(
          /template 'code-only' does not have the (shell|files) capability/,
        );
      }
      // The daemon exports the home with its own token, so the snapshot has the cell's file.
      await only.snapshot({ name: 'code-only-snap' });
      const again = await Sandbox.create({ home: abx.home, template: 'code-only-snap' });
      try {
        expect((await again.runCode("open('kept.txt').read()")).text).toBe("'from a cell'");
      } finally {
        await again.kill();
      }
    } finally {
      await only.kill();
    }
  });
});
