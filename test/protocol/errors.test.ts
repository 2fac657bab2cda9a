import { readFileSync } from 'node:fs';
import { describe, expect, test } from 'vitest';
import {
  ArgumentError,
  CommandExitError,
  CommandNotFoundError,
  CommandTimeoutError,
  ERROR_CLASSES,
  errorClassOf,
  errorFromBody,
  errorResponse,
  InvalidArgumentError,
  MethodNotAllowedError,
  NotFoundError,
  PermissionDeniedError,
  SandboxError,
  ServerCommandError,
  TemplateError,
  TimeoutError,
  UnavailableError,
  UpstreamError,
} from '../../runtime/protocol/errors.js';
import { MultipartError } from '../../runtime/server/multipart.js';
import { sources } from '../helpers/imports.js';

/** JavaScript's own error classes: a command may throw them; they are not ours to send. */
const BUILT_IN = new Set(['Error', 'TypeError', 'RangeError', 'SyntaxError', 'AggregateError']);

/**
 * Classes whose instances never cross the wire from a server: thrown and caught on one side.
 * Everything else a server of this package constructs must be in the table.
 */
const LOCAL_ONLY = new Set([
  'UsageError',
  'ExitCode',
  'ToolCallError',
  'CallbackError',
  // The file-metadata check's own: every caller turns it into a BadRequestError (a 400).
  'MetadataError',
  // The Docker engine client's: engine.ts reads their status and Docker's words into the
  // provider's own errors.
  'EngineApiError',
  'ProgressError',
  // The workspace core's: the daemon turns them into 400s (sandbox-workspace.ts, asApiError:
  // an InvalidArgumentError, `workspace_refused` for a refusal, `workspace_write_failed` with
  // its rollback's fields for a failure while writing).
  'WorkspaceError',
  'WorkspaceRefusedError',
  'WorkspaceWriteError',
  // A daemon that cannot start says so in one line of its own (daemon-main.ts), to no client.
  'PortInUseError',
]);

/**
 * Subclasses of a class of the table that go on the wire as that class's type (their `type` is
 * inherited): the multipart reader's error is a BadRequestError to a client.
 */
const SENT_AS_PARENT = new Map<string, () => SandboxError>([
  ['MultipartError', () => new MultipartError('m')],
]);

/** Every `new XError(` and `XError.of(` in the code of the servers (command server, envd, daemon). */
function errorsConstructedIn(dirs: string[]): Set<string> {
  const names = new Set<string>();
  for (const file of dirs.flatMap((dir) => sources(dir))) {
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(/\bnew ([A-Z]\w*Error)\(|\b([A-Z]\w*Error)\.of\(/g)) {
      names.add((m[1] ?? m[2]) as string);
    }
  }
  return names;
}

describe('one table of wire types', () => {
  test('every type a server of this package can send maps to a class of the table', () => {
    const sent = errorsConstructedIn([
      'runtime',
      'src/control',
      'src/providers',
      'src/installation',
      'src/sandbox',
      'src/commands',
    ]);
    // The scan sees what the servers construct (a sanity floor: it must find the usual ones).
    expect([...sent]).toEqual(
      expect.arrayContaining(['ArgumentError', 'SandboxNotFoundError', 'UpstreamError']),
    );
    const missing = [...sent].filter(
      (name) =>
        !BUILT_IN.has(name) &&
        !LOCAL_ONLY.has(name) &&
        !SENT_AS_PARENT.has(name) &&
        errorClassOf(name) === undefined,
    );
    expect(missing).toEqual([]);
    for (const [name, make] of SENT_AS_PARENT) {
      const error = make();
      expect([name, errorClassOf(error.type)?.type]).toEqual([name, error.type]);
      expect(error).toBeInstanceOf(errorClassOf(error.type) as typeof SandboxError);
    }
  });

  test('each class names its own type once; types are unique; all share one root', () => {
    const types = ERROR_CLASSES.map((cls) => cls.type);
    expect(new Set(types).size).toBe(types.length);
    for (const cls of ERROR_CLASSES) {
      const error = Reflect.construct(SandboxError, ['m'], cls) as SandboxError;
      expect(error).toBeInstanceOf(SandboxError);
      expect([error.name, error.type, error.status]).toEqual([cls.type, cls.type, cls.status]);
      expect(errorClassOf(cls.type)).toBe(cls);
    }
  });

  test('statuses follow the classes: 4xx for requests, 404s, 5xx for failures', () => {
    const status = (type: string) => errorClassOf(type)?.status;
    expect(status('ArgumentError')).toBe(400);
    expect(status('AuthenticationError')).toBe(401);
    expect(status('PermissionDeniedError')).toBe(403);
    expect(status('CapabilityError')).toBe(403);
    expect(status('SandboxNotFoundError')).toBe(404);
    expect(status('MethodNotAllowedError')).toBe(405);
    expect(status('RequestTimeoutError')).toBe(408);
    expect(status('PayloadTooLargeError')).toBe(413);
    expect(status('UpstreamError')).toBe(502);
    expect(status('ToolUnavailableError')).toBe(503);
    expect(status('CommandTimeoutError')).toBe(504);
  });
});

describe('round trip: a server error becomes the same class on the client', () => {
  test.each(ERROR_CLASSES.map((cls) => [cls.type, cls] as const))('%s', (_, cls) => {
    const sent = Reflect.construct(
      SandboxError,
      ['what went wrong', { code: 'EISDIR', problems: ['a', 'b'], details: { extra: 1 } }],
      cls,
    ) as SandboxError;
    const { status, body } = errorResponse(sent);
    const got = errorFromBody(status, JSON.parse(JSON.stringify(body)));
    expect(got).toBeInstanceOf(cls);
    expect(got.constructor).toBe(cls);
    expect([got.message, got.type, got.status, got.code, got.problems, got.details]).toEqual([
      'what went wrong',
      cls.type,
      cls.status,
      'EISDIR',
      ['a', 'b'],
      { extra: 1 },
    ]);
  });

  test('subclass fields travel in the body: usage, available, allow, result, location', () => {
    const roundTrip = <T extends SandboxError>(error: T): T => {
      const { status, body } = errorResponse(error);
      return errorFromBody(status, JSON.parse(JSON.stringify(body))) as T;
    };
    const argument = roundTrip(ArgumentError.of('train', ['epochs must be an integer'], 'u'));
    expect([argument.command, argument.usage, argument.problems]).toEqual([
      'train',
      'u',
      ['epochs must be an integer'],
    ]);
    expect(roundTrip(CommandNotFoundError.of('nope', ['a', 'b'])).available).toEqual(['a', 'b']);
    const allow = new MethodNotAllowedError('no', { details: { allow: ['GET', 'PUT'] } });
    expect(roundTrip(allow).allow).toEqual(['GET', 'PUT']);
    const result = { stdout: 'out', stderr: 'err', exitCode: 3 };
    expect(roundTrip(CommandExitError.of(result)).result).toEqual(result);
    const timeout = roundTrip(CommandTimeoutError.of('slow', { ...result, error: 'timed out' }));
    expect(timeout).toBeInstanceOf(TimeoutError);
    expect(timeout.result).toEqual({ ...result, error: 'timed out' });
    expect(roundTrip(new TemplateError('bad key', 't.yaml:3:1')).location).toBe('t.yaml:3:1');
  });
});

describe('what is not ours', () => {
  test("a command's own exception keeps its name as type; the class follows the status", () => {
    const body = errorResponse(new RangeError('no luck'));
    expect(body).toEqual({ status: 500, body: { error: 'no luck', type: 'RangeError' } });
    const got = errorFromBody(body.status, body.body);
    expect([got.constructor, got.type, got.status]).toEqual([SandboxError, 'RangeError', 500]);
    const asCommand = errorFromBody(body.status, body.body, ServerCommandError);
    expect([asCommand.constructor, asCommand.type]).toEqual([ServerCommandError, 'RangeError']);
  });

  test.each([
    [400, InvalidArgumentError],
    [403, PermissionDeniedError],
    [404, NotFoundError],
    [502, UpstreamError],
    [503, UnavailableError],
    [504, TimeoutError],
    [500, SandboxError],
  ] as const)('a body that is not ours, status %i → %o', (status, cls) => {
    const got = errorFromBody(status, '<html>proxy error</html>');
    expect(got.constructor).toBe(cls);
    expect(got.message).toBe(`request failed with status ${status}`);
  });
});

describe('no message-text matching', () => {
  test('no code of the package branches on an error message', () => {
    const offenders: string[] = [];
    for (const file of [...sources('src'), ...sources('runtime')]) {
      const text = readFileSync(file, 'utf8');
      const pattern =
        /\.message\)?\s*\.\s*(?:includes|startsWith|endsWith|match|search)\(|\.test\([^)]*\.message\b/g;
      for (const m of text.matchAll(pattern)) offenders.push(`${file}: ${m[0]}`);
    }
    expect(offenders).toEqual([]);
  });
});

describe('docs/errors.md', () => {
  test('lists every class of the table with its status', () => {
    const doc = readFileSync('docs/errors.md', 'utf8');
    const missing = ERROR_CLASSES.filter(
      (cls) => !new RegExp(`\\| \`${cls.type}\` +\\| ${cls.status} +\\|`).test(doc),
    ).map((cls) => cls.type);
    expect(missing).toEqual([]);
  });
});
