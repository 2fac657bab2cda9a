import { createRequire } from 'node:module';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { format, inspect } from 'node:util';
import { createContext, Script } from 'node:vm';

// envd's JavaScript code-context driver, bundled to dist/runtime/js_driver.cjs and started once
// per context with envd's own node. Requests are JSON lines on stdin; events are JSON lines on
// stdout. The cell runs in one `vm` context, so top-level `var`/function declarations persist
// (`let`/`const` persist too: a Script's lexical scope is shared by the context's scripts). A cell
// with top-level `await` is rewritten first (see asyncCell).

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

// ---- Top-level await ----------------------------------------------------------------------
//
// A cell that does not compile as a script but uses `await` is rewritten into an async arrow
// function, like Node's REPL does (which uses acorn; this driver has node's built-ins only, so a
// small tokenizer finds the cell's top-level statements):
//   - `var`/`let`/`const` declarations become assignments, so their names are properties of the
//     context's global object and persist (a `const` can then be assigned again);
//   - a `class` declaration becomes an assignment of a class expression;
//   - a function declaration stays (hoisted in the cell) and is copied to the global object;
//   - the last statement, if it is an expression, is returned: it is the cell's value.
// What the tokenizer cannot read (an unterminated string, say) leaves the cell as it was, so the
// script's own SyntaxError is reported.

interface Token {
  type: 'name' | 'punct' | 'literal';
  value: string;
  start: number;
  end: number;
  /** A line break comes between this token and the one before. */
  nl: boolean;
}

const NAME =
  /#?(?:[\p{ID_Start}$_]|\\u[\da-fA-F]{4}|\\u\{[\da-fA-F]+\})(?:[\p{ID_Continue}$\u200c\u200d]|\\u[\da-fA-F]{4}|\\u\{[\da-fA-F]+\})*/uy;
const NUMBER =
  /(?:0[xXoObB][\da-fA-F_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?[\d_]+)?)n?/y;
const PUNCT =
  />>>=|\.\.\.|===|!==|\*\*=|<<=|>>=|>>>|&&=|\|\|=|\?\?=|=>|==|!=|<=|>=|&&|\|\||\?\?|\?\.(?!\d)|\+\+|--|\+=|-=|\*=|\/=|%=|&=|\|=|\^=|\*\*|<<|>>|[{}()[\];,<>+\-*/%&|^!~?:=.@]/y;
const LINE_BREAK = /[\n\r\u2028\u2029]/;
/** Keywords after which a `/` starts a regular expression, not a division. */
const BEFORE_EXPRESSION = new Set(
  'await case delete do else in instanceof new of return throw typeof void yield'.split(' '),
);
/** Keywords that need what follows, even on the next line. */
const NEEDS_MORE = new Set(
  'await case class const default delete do else extends function in instanceof let new of typeof var void yield'.split(
    ' ',
  ),
);
/** Tokens that continue the statement on the line before. */
const CONTINUES = new Set(
  '( [ . ?. , ? : = => + - * / % ** == != === !== < > <= >= && || ?? & | ^ << >> >>> += -= *= /= %= **= <<= >>= >>>= &= |= ^= &&= ||= ??= in instanceof'.split(
    ' ',
  ),
);
/** Keywords that go on after a `}` on the same line (`} else {`). */
const AFTER_BRACE = new Set('else catch finally while'.split(' '));
/** First words of the statements that are not expressions. */
const STATEMENT_WORDS = new Set(
  'break class const continue debugger do export for function if import let return switch throw try var while with'.split(
    ' ',
  ),
);

/**
 * The tokens of `code` from `from` on, up to the `}` that closes a template's `${` when `inner`;
 * what lies within a template literal is one token. `undefined` when the code cannot be read.
 */
function tokenize(
  code: string,
  from = 0,
  inner = false,
): { tokens: Token[]; end: number } | undefined {
  const tokens: Token[] = [];
  let depth = 0;
  let nl = false;
  let i = from;
  if (i === 0 && code.startsWith('#!'))
    i = code.indexOf('\n') < 0 ? code.length : code.indexOf('\n');
  const push = (type: Token['type'], end: number) => {
    tokens.push({ type, value: code.slice(i, end), start: i, end, nl });
    nl = false;
    i = end;
  };
  const regexAllowed = () => {
    const last = tokens.at(-1);
    if (!last) return true;
    if (last.type === 'name') return BEFORE_EXPRESSION.has(last.value);
    if (last.type === 'literal') return false;
    return !/^(?:[)\]}]|\+\+|--)$/.test(last.value);
  };
  while (i < code.length) {
    const c = code[i];
    if (LINE_BREAK.test(c)) {
      nl = true;
      i++;
    } else if (/\s/.test(c)) {
      i++;
    } else if (code.startsWith('//', i)) {
      const end = code.slice(i).search(LINE_BREAK);
      i = end < 0 ? code.length : i + end;
    } else if (code.startsWith('/*', i)) {
      const end = code.indexOf('*/', i + 2);
      if (end < 0) return undefined;
      if (LINE_BREAK.test(code.slice(i, end))) nl = true;
      i = end + 2;
    } else if (c === '"' || c === "'") {
      let j = i + 1;
      while (j < code.length && code[j] !== c) {
        if (code[j] === '\\') j += code.startsWith('\r\n', j + 1) ? 2 : 1;
        else if (code[j] === '\n') return undefined;
        j++;
      }
      if (j >= code.length) return undefined;
      push('literal', j + 1);
    } else if (c === '`') {
      let j = i + 1;
      for (;;) {
        if (j >= code.length) return undefined;
        if (code[j] === '\\') j += 2;
        else if (code[j] === '`') break;
        else if (code.startsWith('${', j)) {
          const rest = tokenize(code, j + 2, true);
          if (!rest) return undefined;
          j = rest.end;
        } else j++;
      }
      push('literal', j + 1);
    } else if (c === '/' && regexAllowed()) {
      let j = i + 1;
      let inClass = false;
      for (; j < code.length && (inClass || code[j] !== '/'); j++) {
        if (LINE_BREAK.test(code[j])) return undefined;
        if (code[j] === '\\') j++;
        else if (code[j] === '[') inClass = true;
        else if (code[j] === ']') inClass = false;
      }
      if (j >= code.length) return undefined;
      NAME.lastIndex = j + 1;
      push('literal', NAME.exec(code) ? NAME.lastIndex : j + 1);
    } else if (/[\d]/.test(c) || (c === '.' && /\d/.test(code[i + 1] ?? ''))) {
      NUMBER.lastIndex = i;
      push('literal', NUMBER.exec(code) ? NUMBER.lastIndex : i + 1);
    } else {
      NAME.lastIndex = i;
      if (NAME.exec(code)) {
        push('name', NAME.lastIndex);
        continue;
      }
      PUNCT.lastIndex = i;
      if (!PUNCT.exec(code)) return undefined;
      if (c === '}' && inner && depth === 0) return { tokens, end: i + 1 };
      if ('([{'.includes(c)) depth++;
      else if (')]}'.includes(c)) depth--;
      push('punct', PUNCT.lastIndex);
    }
  }
  return inner ? undefined : { tokens, end: i };
}

/** The cell's top-level statements: first and last token (a closing `;` left out). */
function statements(tokens: Token[]): Array<[number, number]> {
  const found: Array<[number, number]> = [];
  let depth = 0;
  let start = -1;
  /** The statement is a function or class declaration: it ends with the `}` of its body. */
  let declaration = false;
  let body = false;
  const close = (last: number) => {
    if (start >= 0 && last >= start) found.push([start, last]);
    start = -1;
  };
  tokens.forEach((token, i) => {
    const prev = tokens[i - 1];
    if (depth === 0 && start >= 0 && prev) {
      const continues =
        (prev.type === 'punct' && !/^(?:[)\]}]|\+\+|--)$/.test(prev.value)) ||
        (prev.type === 'name' && NEEDS_MORE.has(prev.value)) ||
        CONTINUES.has(token.value) ||
        (token.type === 'literal' && token.value.startsWith('`')) ||
        (token.value === '{' && (prev.value === ')' || prev.type === 'name'));
      if (token.nl && !continues) close(i - 1);
      else if (
        !token.nl &&
        prev.value === '}' &&
        token.type === 'name' &&
        !AFTER_BRACE.has(token.value) &&
        !CONTINUES.has(token.value)
      ) {
        close(i - 1);
      }
    }
    if (depth === 0 && start < 0) {
      if (token.value === ';') return;
      start = i;
      const next = tokens[i + 1]?.value;
      declaration =
        token.value === 'function' ||
        token.value === 'class' ||
        (token.value === 'async' && next === 'function' && !tokens[i + 1].nl);
      body = false;
    }
    if (token.type !== 'punct') return;
    if (token.value === ';' && depth === 0) close(i - 1);
    else if ('([{'.includes(token.value)) {
      if (depth === 0 && token.value === '{') body = true;
      depth++;
    } else if (')]}'.includes(token.value)) {
      depth--;
      if (depth === 0 && token.value === '}' && declaration && body) close(i);
    }
  });
  close(tokens.length - 1);
  return found;
}

/** The declarators of a `var`/`let`/`const` (tokens after the keyword), split at its commas. */
function declarators(tokens: Token[]): Token[][] {
  const parts: Token[][] = [[]];
  let depth = 0;
  for (const token of tokens) {
    if (token.type === 'punct') {
      if ('([{'.includes(token.value)) depth++;
      else if (')]}'.includes(token.value)) depth--;
      else if (token.value === ',' && depth === 0) {
        parts.push([]);
        continue;
      }
    }
    parts.at(-1)?.push(token);
  }
  return parts;
}

/** The cell as the body of an async arrow function, or `undefined` if it cannot be rewritten. */
function asyncCell(code: string): string | undefined {
  const tokens = tokenize(code)?.tokens;
  if (!tokens) return undefined;
  const edits: Array<{ start: number; end: number; text: string }> = [];
  const functions: string[] = [];
  const all = statements(tokens);
  all.forEach(([first, last], n) => {
    const head = tokens[first];
    const next = tokens[first + 1];
    const text = (from: Token, to: Token) => code.slice(from.start, to.end);
    if (
      (head.value === 'var' || head.value === 'let' || head.value === 'const') &&
      next &&
      (next.type === 'name' || next.value === '[' || next.value === '{')
    ) {
      const parts = declarators(tokens.slice(first + 1, last + 1)).map((part) => {
        if (part.length === 0) return 'undefined';
        if (part.some((t) => t.value === '=' && t.type === 'punct')) {
          return `(${text(part[0], part[part.length - 1])})`;
        }
        const name = part[0].value;
        return head.value === 'var'
          ? `(${name} = typeof ${name} === "undefined" ? undefined : ${name})`
          : `(${name} = undefined)`;
      });
      edits.push({
        start: head.start,
        end: tokens[last].end,
        text: `void (${parts.join(', ')});`,
      });
    } else if (head.value === 'class' && next?.type === 'name' && next.value !== 'extends') {
      edits.push({ start: head.start, end: head.start, text: `;${next.value} = ` });
      edits.push({ start: tokens[last].end, end: tokens[last].end, text: ';' });
    } else if (
      head.value === 'function' ||
      (head.value === 'async' && next?.value === 'function')
    ) {
      let at = head.value === 'async' ? first + 2 : first + 1;
      if (tokens[at]?.value === '*') at++;
      if (tokens[at]?.type === 'name') functions.push(tokens[at].value);
    } else if (
      n === all.length - 1 &&
      !STATEMENT_WORDS.has(head.value) &&
      head.value !== '{' &&
      !(head.type === 'name' && next?.value === ':') &&
      !(head.value === 'async' && next?.value === 'function')
    ) {
      edits.push({
        start: head.start,
        end: tokens[last].end,
        text: `return (${text(head, tokens[last])}\n);`,
      });
    }
  });
  // A hashbang line is only allowed first.
  let body = code.startsWith('#!') ? `//${code.slice(2)}` : code;
  for (const edit of edits.reverse()) {
    body = body.slice(0, edit.start) + edit.text + body.slice(edit.end);
  }
  const hoisted = functions.map((name) => `__abx_global.${name} = ${name}; `).join('');
  return `(async (__abx_global) => { ${hoisted}${body}\n})(this)`;
}

// ---- Running cells ------------------------------------------------------------------------

let cells = 0;
/** Rejects what the cell awaits when SIGINT comes (breakOnSigint covers only its synchronous part). */
let interrupt: ((error: Error) => void) | undefined;

/** `value`, awaited if it is a promise (or another thenable), until an interrupt. */
function settle(value: unknown): unknown {
  if (!value || typeof (value as PromiseLike<unknown>).then !== 'function') return value;
  return new Promise((resolve, reject) => {
    interrupt = reject;
    Promise.resolve(value).then(resolve, reject);
  }).finally(() => {
    interrupt = undefined;
  });
}

/** The cell as a script: as it is, or rewritten when it uses top-level `await`. */
function compile(code: string, filename: string): Script {
  try {
    return new Script(code, { filename });
  } catch (error) {
    const rewritten =
      error instanceof SyntaxError && /\bawait\b/.test(code) ? asyncCell(code) : undefined;
    if (rewritten === undefined) throw error;
    try {
      return new Script(rewritten, { filename });
    } catch (again) {
      // Where the script stopped at an `await`, the cell's next error is the one to show.
      throw /\bawait\b/.test((error as Error).message) ? again : error;
    }
  }
}

/** A traceback without the driver's frames: those below the cell's last one, or all of them. */
function traceback(stack: string): string {
  const lines = stack.split('\n');
  const last = lines.findLastIndex((line) => /^\s+at .*<cell \d+>/.test(line));
  if (last >= 0) return lines.slice(0, last + 1).join('\n');
  return lines.filter((line) => !/^\s+at /.test(line)).join('\n');
}

async function run(code: string): Promise<void> {
  cells += 1;
  try {
    const script = compile(code, `<cell ${cells}>`);
    const value = await settle(
      script.runInContext(context, { breakOnSigint: true, displayErrors: false }),
    );
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
      traceback: typeof e?.stack === 'string' ? traceback(e.stack) : inspect(error),
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
// A SIGINT while the cell awaits ends the wait (what it awaits runs on, unobserved); outside a
// cell it must not end the context.
process.on('SIGINT', () => {
  const error = new Error('Script execution was interrupted by `SIGINT` while awaiting');
  error.stack = `Error: ${error.message}`;
  interrupt?.(error);
});
