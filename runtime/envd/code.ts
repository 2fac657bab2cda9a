import { statSync } from 'node:fs';
import { Readable } from 'node:stream';
import { ContextDeadError } from '../protocol/errors.js';
import { CODE_LANGUAGES, type CodeLanguage } from '../protocol/wire.js';
import type { ServerContext } from '../server/context.js';
import { BadRequestError, InvalidPathError } from '../server/errors.js';
import { safePath } from '../server/file-system.js';
import { Reply } from '../server/http.js';
import { defineGroup } from '../server/route-group.js';
import { argList, envOf } from '../server/validate.js';
import { CodeContexts, contextView, type DriverFiles } from './code/contexts.js';

const NDJSON = {
  'content-type': 'application/x-ndjson; charset=utf-8',
  'cache-control': 'no-store',
};

/** Default `timeout_ms` of `POST /execute`. */
export const EXECUTE_TIMEOUT_MS = 60_000;

function languageOf(value: unknown): CodeLanguage {
  if (!CODE_LANGUAGES.includes(value as CodeLanguage)) {
    throw new BadRequestError(
      `language must be one of ${CODE_LANGUAGES.join(', ')}, not ${JSON.stringify(value)}`,
    );
  }
  return value as CodeLanguage;
}

function directory(path: string): string {
  const cwd = safePath(path, 'cwd');
  if (!statSync(cwd, { throwIfNoEntry: false })?.isDirectory()) {
    throw new InvalidPathError(`cwd ${cwd} is not an existing directory`);
  }
  return cwd;
}

/**
 * E2B-style code contexts: one interpreter per context (Python, JavaScript or bash) kept alive
 * between executions, and `POST /execute`, which streams a cell's output, results and error as
 * NDJSON while it runs. Routes sit at the root (`/contexts`, `/execute`), hence the empty prefix.
 */
export function codeGroup(files: DriverFiles) {
  // One table per server: the group may serve several servers (tests), each with its processes.
  const tables = new WeakMap<ServerContext, CodeContexts>();
  const contextsOf = (ctx: ServerContext) => {
    let table = tables.get(ctx);
    if (!table) {
      table = new CodeContexts(ctx.processes, files);
      tables.set(ctx, table);
    }
    return table;
  };

  return defineGroup('CODE', '', 'code contexts: stateful Python, JavaScript and bash', [
    {
      method: 'POST',
      path: '/contexts',
      summary: 'Starts a code context (a Python, JavaScript or bash interpreter kept alive).',
      args: argList({
        'language?': ['str', 'python', 'python, javascript or bash'],
        'cwd?': ['str', '.', 'working directory of the interpreter'],
      }),
      handler: async ({ args, ctx }) => {
        const language = languageOf(args.language);
        const context = await contextsOf(ctx).create(language, directory(args.cwd as string));
        return contextView(context);
      },
    },
    {
      method: 'GET',
      path: '/contexts',
      summary: 'Code contexts, default ones included.',
      handler: ({ ctx }) => ({ contexts: contextsOf(ctx).list().map(contextView) }),
    },
    {
      method: 'DELETE',
      path: '/contexts/{id}',
      summary: 'Kills a context’s interpreter and forgets the context.',
      body: 'none',
      handler: ({ params, ctx }) => {
        contextsOf(ctx).remove(params.id ?? '');
        return { id: params.id, deleted: true };
      },
    },
    {
      method: 'POST',
      path: '/contexts/{id}/restart',
      summary: 'Replaces a context’s interpreter with a new one (its state is lost).',
      body: 'none',
      handler: async ({ params, ctx }) =>
        contextView(await contextsOf(ctx).restart(params.id ?? '')),
    },
    {
      method: 'POST',
      path: '/execute',
      summary:
        'Runs code in a context and streams NDJSON while it runs: stdout, stderr, results, error, `end`.',
      args: argList({
        code: ['str', undefined, 'the cell to run'],
        'context_id?': ['str', undefined, 'the context to run in; default: that of `language`'],
        'language?': ['str', undefined, 'python (default), javascript or bash'],
        'env?': ['env', undefined, 'variables added to the interpreter’s environment'],
        'timeout_ms?': ['int', EXECUTE_TIMEOUT_MS, 'interrupt the cell past this; 0: no limit'],
      }),
      handler: async ({ args, ctx, closed }) => {
        if (args.context_id !== undefined && args.language !== undefined) {
          throw new BadRequestError(
            'give context_id or language, not both: a context has its own language',
          );
        }
        const timeoutMs = args.timeout_ms as number;
        if (timeoutMs < 0)
          throw new BadRequestError('timeout_ms must not be negative (0: no limit)');
        const env = envOf(args.env);
        const contexts = contextsOf(ctx);
        const context =
          args.context_id !== undefined
            ? contexts.get(args.context_id as string)
            : await contexts.byLanguage(languageOf(args.language ?? 'python'), directory('.'));
        if (context.interpreter.dead) {
          throw new ContextDeadError(context.interpreter.deadMessage().replace('{id}', context.id));
        }
        // A client that goes away interrupts its cell, so the context is free for the next one.
        const events = context.interpreter.execute({
          code: args.code as string,
          env,
          timeoutMs,
          signal: closed,
        });
        return new Reply(
          200,
          Readable.from(
            (async function* () {
              for await (const event of events) yield `${JSON.stringify(event)}\n`;
            })(),
          ),
          NDJSON,
        );
      },
    },
  ]);
}
