import { createRequire } from 'node:module';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { format, inspect } from 'node:util';
import { createContext, Script } from 'node:vm';

// envd's JavaScript code-context driver, bundled to dist/runtime/js_driver.cjs and started once
// per context with envd's own node. Requests are JSON lines on stdin; events are JSON lines on
// stdout. The cell runs in one `vm` context, so top-level `var`/function declarations persist
// (`let`/`const` persist too: a Script's lexical scope is shared by the context's scripts).

const write = process.stdout.write.bind(process.stdout);
const send = (event: Record<string, unknown>) => write(`${JSON.stringify(event)}\n`);

const emitter =
  (type: 'stdout' | 'stderr') =>
  // biome-ignore lint/suspicious/noExplicitAny: console methods take anything
  (...args: any[]) =>
    send({ type, text: `${format(...args)}\n` });
const log = emitter('stdout');
const warn = emitter('stderr');
const userConsole = {
  ...console,
  log,
  info: log,
  debug: log,
  warn,
  error: warn,
  trace: warn,
};
// What user code writes to process.stdout/stderr becomes events too, not raw lines.
process.stdout.write = ((chunk: unknown) => {
  send({ type: 'stdout', text: String(chunk) });
  return true;
}) as typeof process.stdout.write;
process.stderr.write = ((chunk: unknown) => {
  send({ type: 'stderr', text: String(chunk) });
  return true;
}) as typeof process.stderr.write;

const sandbox: Record<string, unknown> = {
  console: userConsole,
  process,
  Buffer,
  URL,
  URLSearchParams,
  TextEncoder,
  TextDecoder,
  setTimeout,
  clearTimeout,
  setInterval,
  clearInterval,
  setImmediate,
  clearImmediate,
  queueMicrotask,
  structuredClone,
  fetch: globalThis.fetch,
  require: createRequire(join(process.cwd(), '__abx_cell__.js')),
};
sandbox.globalThis = sandbox;
const context = createContext(sandbox);

let cells = 0;

async function run(code: string): Promise<void> {
  cells += 1;
  try {
    const script = new Script(code, { filename: `<cell ${cells}>` });
    let value = script.runInContext(context, { breakOnSigint: true, displayErrors: false });
    if (value instanceof Promise || (value && typeof value.then === 'function'))
      value = await value;
    if (value !== undefined) send({ type: 'result', is_main_result: true, text: inspect(value) });
  } catch (error) {
    // The context is another realm: its errors are not `instanceof Error` here.
    const e =
      typeof error === 'object' && error !== null && 'message' in error
        ? (error as Error)
        : undefined;
    send({
      type: 'error',
      name: e?.name ?? 'Error',
      value: e ? e.message : inspect(error),
      traceback: e?.stack ?? inspect(error),
    });
  }
}

let queue = Promise.resolve();
createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY }).on(
  'line',
  (line) => {
    queue = queue.then(async () => {
      const request = JSON.parse(line) as {
        code: string;
        env?: Record<string, string>;
        execution_count?: number;
      };
      Object.assign(process.env, request.env ?? {});
      await run(request.code);
      send({ type: 'end', execution_count: request.execution_count ?? 0 });
    });
  },
);
// A SIGINT outside a cell (breakOnSigint covers the synchronous part) must not end the context.
process.on('SIGINT', () => {});
