import {
  type CodeContextWire,
  type CodeLanguage,
  RESULT_FORMATS,
} from '../../runtime/protocol/wire.js';
import { InvalidArgumentError } from '../errors.js';
import { ndjsonLines } from '../util/ndjson.js';
import type { HttpClient } from './http-client.js';

/** The languages a code context runs. */
export type { CodeLanguage };

/**
 * A stateful interpreter in the sandbox: variables, imports and the working directory persist;
 * `alive` is false once its interpreter died (restart it).
 */
export type CodeContext = CodeContextWire;

/** A line of output as it arrives (E2B's `OutputMessage`). */
export interface OutputMessage {
  line: string;
  /** Milliseconds since the epoch when this side received it. */
  timestamp: number;
  /** True for stderr. */
  error: boolean;
}

/** An exception the code raised: its class name, its message and the formatted traceback. */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

const FORMATS = RESULT_FORMATS;
type Format = (typeof FORMATS)[number];

/**
 * One displayed value: the last expression of a cell (`isMainResult`), a `display(...)`, or a
 * matplotlib figure. Each format the value has is set; binary ones (`png`, `jpeg`, `pdf`) are
 * base64. Formats this SDK does not know are kept in `extra`.
 */
export class Result {
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  pdf?: string;
  latex?: string;
  json?: unknown;
  javascript?: string;
  readonly isMainResult: boolean;
  extra?: Record<string, unknown>;

  constructor(wire: Record<string, unknown>) {
    this.isMainResult = wire.is_main_result === true;
    for (const [key, value] of Object.entries(wire)) {
      if (key === 'type' || key === 'is_main_result' || value === undefined || value === null) {
        continue;
      }
      if ((FORMATS as readonly string[]).includes(key)) {
        (this as Record<Format, unknown>)[key as Format] = value;
      } else {
        this.extra = { ...this.extra, [key]: value };
      }
    }
  }

  /** The formats this result has, e.g. `['text', 'html']`. */
  formats(): string[] {
    return FORMATS.filter((format) => this[format] !== undefined);
  }
}

/** What `runCode` returns once the cell has run. */
export class Execution {
  readonly results: Result[] = [];
  readonly logs: { stdout: string[]; stderr: string[] } = { stdout: [], stderr: [] };
  error?: ExecutionError;
  executionCount?: number;

  /** The main result's text (the value of the cell's last expression), if any. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }
}

/** Options of `sandbox.runCode`. */
export interface RunCodeOptions {
  /** The language of the default context to run in (default python); not with `context`. */
  language?: CodeLanguage;
  /** A context made with `createCodeContext`; not with `language`. */
  context?: CodeContext;
  onStdout?: (output: OutputMessage) => unknown;
  onStderr?: (output: OutputMessage) => unknown;
  onResult?: (result: Result) => unknown;
  onError?: (error: ExecutionError) => unknown;
  /** Environment variables of this cell only. */
  envs?: Record<string, string>;
  /** The cell is interrupted past this (default 60 s); the context keeps its state. */
  timeoutMs?: number;
  /** How long to wait for the sandbox to start answering (default the sandbox's). */
  requestTimeoutMs?: number;
}

const DEFAULT_CODE_TIMEOUT_MS = 60_000;

/** Runs a cell through envd's `/execute` and gathers its events into an {@link Execution}. */
export async function runCode(
  envd: (timeoutMs: number) => HttpClient,
  code: string,
  options: RunCodeOptions = {},
): Promise<Execution> {
  if (options.context && options.language) {
    throw new InvalidArgumentError(
      'give runCode a language or a context, not both (a context has its language)',
    );
  }
  const timeoutMs = options.timeoutMs ?? DEFAULT_CODE_TIMEOUT_MS;
  // The answer streams while the code runs: wait for each event as long as the cell may run.
  const client = envd(Math.max(options.requestTimeoutMs ?? 0, timeoutMs + 15_000));
  const response = await client.send('POST', '/execute', {
    body: {
      code,
      ...(options.context ? { context_id: options.context.id } : {}),
      ...(options.language ? { language: options.language } : {}),
      ...(options.envs ? { env: options.envs } : {}),
      timeout_ms: timeoutMs,
    },
  });
  const execution = new Execution();
  for await (const event of ndjsonLines<Record<string, unknown>>(response.body)) {
    switch (event.type) {
      case 'stdout':
      case 'stderr': {
        const line = String(event.text ?? '');
        const error = event.type === 'stderr';
        execution.logs[event.type].push(line);
        await (error ? options.onStderr : options.onStdout)?.({
          line,
          timestamp: Date.now(),
          error,
        });
        break;
      }
      case 'result': {
        const result = new Result(event);
        execution.results.push(result);
        await options.onResult?.(result);
        break;
      }
      case 'error': {
        execution.error = {
          name: String(event.name ?? 'Error'),
          value: String(event.value ?? ''),
          traceback: String(event.traceback ?? ''),
        };
        await options.onError?.(execution.error);
        break;
      }
      case 'end':
        if (typeof event.execution_count === 'number') {
          execution.executionCount = event.execution_count;
        }
        break;
    }
  }
  return execution;
}

/** envd's context routes, for the `Sandbox` methods. */
export const CodeContexts = {
  async create(
    envd: HttpClient,
    options: { language?: CodeLanguage; cwd?: string } = {},
  ): Promise<CodeContext> {
    return envd.json<CodeContext>('POST', '/contexts', {
      body: {
        language: options.language ?? 'python',
        ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
      },
    });
  },

  async list(envd: HttpClient): Promise<CodeContext[]> {
    return (await envd.json<{ contexts: CodeContext[] }>('GET', '/contexts')).contexts;
  },

  async restart(envd: HttpClient, context: CodeContext | string): Promise<void> {
    const id = typeof context === 'string' ? context : context.id;
    await envd.json('POST', `/contexts/${encodeURIComponent(id)}/restart`, { body: {} });
  },

  async remove(envd: HttpClient, context: CodeContext | string): Promise<void> {
    const id = typeof context === 'string' ? context : context.id;
    await envd.json('DELETE', `/contexts/${encodeURIComponent(id)}`);
  },
};
