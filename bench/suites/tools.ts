// `--only tools` (bench/README.md).
import { Sandbox } from 'abx-sandbox';
import { log, results, row, scale } from '../runner.js';
import { round, type Summary, summarize, timeEach } from '../stats.js';

/** A python3 -c per call, the deepagents Python reference's way: the request as JSON on stdin. */
function pythonPerCall(sandbox: Sandbox, script: string, request: unknown) {
  const quoted = `'${script.replaceAll("'", `'\\''`)}'`;
  return sandbox.commands.run(
    `python3 -c ${quoted} <<'__ABX_BENCH__'\n${JSON.stringify(request)}\n__ABX_BENCH__`,
  );
}

/** A tool call that must succeed: a failing one would time an error path instead. */
async function must<T extends { error?: string }>(call: Promise<T>): Promise<T> {
  const result = await call;
  if (result.error) throw new Error(`bench: ${result.error}`);
  return result;
}

/** Alternates an edit of one file between MARKER → REKRAM and back. */
function markerSwap(): () => [string, string] {
  let flip = false;
  return () => {
    flip = !flip;
    return flip ? ['MARKER', 'REKRAM'] : ['REKRAM', 'MARKER'];
  };
}

const PY_READ = `import sys, json
p = json.loads(sys.stdin.read())
with open(p['path']) as f: lines = f.read().splitlines()
print('\\n'.join(lines[p['offset']:p['offset'] + p['limit']]))`;

const PY_EDIT = `import sys, json
p = json.loads(sys.stdin.read())
with open(p['path']) as f: text = f.read()
n = text.count(p['old'])
if n != 1: sys.exit(1)
with open(p['path'], 'w') as f: f.write(text.replace(p['old'], p['new'], 1))
print(n)`;

const PY_GREP = `import sys, os, json
p = json.loads(sys.stdin.read())
out = []
for root, dirs, files in os.walk(p['path']):
    dirs.sort()
    for name in sorted(files):
        full = os.path.join(root, name)
        with open(full, errors='replace') as f:
            for i, line in enumerate(f, 1):
                if p['pattern'] in line: out.append({'path': full, 'line': i, 'text': line.rstrip('\\n')})
print(json.dumps(out))`;

/**
 * Issue 17: the file tools of a running sandbox, answered by envd (native), by a node program per
 * call through execute() (any BaseSandbox's way), and by a python3 -c per call (the deepagents
 * Python reference's way), on small everyday work; then the large cases, native and execute().
 */
export async function agentTools(sandbox: Sandbox) {
  log('BaseSandbox: native vs execute() vs python3 -c per call');
  await sandbox.commands.run(
    `node -e "
      const fs = require('fs');
      fs.writeFileSync('big.txt', Array.from({ length: 100000 }, (_, i) => 'line ' + i).join('\\n'));
      fs.mkdirSync('tree', { recursive: true });
      for (let i = 0; i < 10000; i++) fs.writeFileSync('tree/f' + i + '.txt', i % 1000 === 0 ? 'needle here' : 'hay');
      fs.writeFileSync('ten.txt', 'x'.repeat(5 * 1024 * 1024) + 'MARKER' + 'y'.repeat(5 * 1024 * 1024));
      const code = Array.from({ length: 2000 }, (_, i) => '    value_' + i + ' = compute(' + i + ')  # step ' + i);
      fs.writeFileSync('page.py', code.join('\\n') + '\\n');
      fs.writeFileSync('small.py', code.slice(0, 200).join('\\n') + '\\nMARKER\\n');
      for (let d = 0; d < 10; d++) {
        fs.mkdirSync('small/d' + d, { recursive: true });
        for (let f = 0; f < 10; f++) fs.writeFileSync('small/d' + d + '/m' + f + '.py', code.slice(0, 30).join('\\n') + (f === 3 ? '\\nneedle = 1\\n' : '\\n'));
      }
    "`,
  );
  const page = { path: 'page.py', offset: 500, limit: 200 };
  const swapSmall = markerSwap();
  const swapLarge = markerSwap();
  const small = async (fileTools: Sandbox['fileTools'], n: number) => {
    sandbox.fileTools = fileTools;
    const read = summarize(
      await timeEach(n, () =>
        must(sandbox.read(page.path, { offset: page.offset, limit: page.limit })),
      ),
    );
    const edit = summarize(
      await timeEach(n, () => {
        const [from, to] = swapSmall();
        return must(sandbox.edit('small.py', from, to));
      }),
    );
    const grep = summarize(
      await timeEach(n, () => must(sandbox.grep('needle', { path: 'small' }))),
    );
    return { read, edit, grep };
  };
  const python = {
    read: summarize(await timeEach(scale(30, 8), () => pythonPerCall(sandbox, PY_READ, page), 3)),
    edit: summarize(
      await timeEach(
        scale(30, 8),
        () => {
          const [from, to] = swapSmall();
          return pythonPerCall(sandbox, PY_EDIT, { path: 'small.py', old: from, new: to });
        },
        3,
      ),
    ),
    grep: summarize(
      await timeEach(
        scale(30, 8),
        () => pythonPerCall(sandbox, PY_GREP, { path: 'small', pattern: 'needle' }),
        3,
      ),
    ),
  };
  const execute = await small('execute', scale(30, 8));
  const native = await small('native', scale(200, 30));
  const large = async (fileTools: Sandbox['fileTools']) => {
    sandbox.fileTools = fileTools;
    const read = summarize(
      await timeEach(scale(20, 5), () =>
        must(sandbox.read('big.txt', { offset: 50_000, limit: 2000 })),
      ),
    );
    const grep = summarize(
      await timeEach(scale(5, 2), () => must(sandbox.grep('needle', { path: 'tree' })), 1),
    );
    const edit = summarize(
      await timeEach(
        scale(5, 2),
        () => {
          const [from, to] = swapLarge();
          return must(sandbox.edit('ten.txt', from, to));
        },
        0,
      ),
    );
    return { read, grep, edit };
  };
  const largeExecute = await large('execute');
  const largeNative = await large('native');
  sandbox.fileTools = 'native';
  results.agentTools = {
    small: { native, execute, python },
    large: { native: largeNative, execute: largeExecute },
  };
  const trio = (pick: (x: { read: Summary; edit: Summary; grep: Summary }) => Summary) =>
    `${[native, execute, python].map((x) => round(pick(x).p50, 2)).join(' / ')} ms p50`;
  const faster = (pick: (x: { read: Summary; edit: Summary; grep: Summary }) => Summary) =>
    `native ${round(pick(execute).p50 / pick(native).p50, 0)}× faster than execute(), ${round(pick(python).p50 / pick(native).p50, 0)}× than python3 -c`;
  row(
    '7 BaseSandbox',
    'read 200-line page: native / execute() / python3 -c',
    trio((x) => x.read),
    `${faster((x) => x.read)}; goal native ≤ 5 ms`,
  );
  row(
    '7 BaseSandbox',
    'small edit: native / execute() / python3 -c',
    trio((x) => x.edit),
    `${faster((x) => x.edit)}; goal native ≤ 5 ms`,
  );
  row(
    '7 BaseSandbox',
    'grep 100 files: native / execute() / python3 -c',
    trio((x) => x.grep),
    `${faster((x) => x.grep)}; goal native ≤ 5 ms`,
  );
  const pair = (pick: (x: { read: Summary; edit: Summary; grep: Summary }) => Summary) =>
    `${round(pick(largeNative).p50, 1)} / ${round(pick(largeExecute).p50, 1)} ms p50`;
  row(
    '7 BaseSandbox',
    'read 2000 lines at offset 50 000 of 100 000: native / execute()',
    pair((x) => x.read),
  );
  row(
    '7 BaseSandbox',
    'grep over 10 000 files: native / execute()',
    pair((x) => x.grep),
  );
  row(
    '7 BaseSandbox',
    'edit of a 10 MiB file: native / execute()',
    pair((x) => x.edit),
  );
}
