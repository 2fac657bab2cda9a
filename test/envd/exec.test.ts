import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect } from 'vitest';
import { FINISHED_KEPT, STREAM_LOG_BYTES } from '../../runtime/server/process-table.js';
import { eventually, isAlive } from '../server/harness.js';
import { type Event, FRONT_BINARY, frontTest, test as nodeTest, textOf } from './harness.js';

const dir = mkdtempSync(join(tmpdir(), 'abx-envd-exec-'));

/** Reads `iterator` until an event satisfies `wanted`; the events read, that one last. */
async function readUntil(
  iterator: AsyncIterator<Event>,
  wanted: (event: Event) => boolean,
): Promise<Event[]> {
  const seen: Event[] = [];
  for (;;) {
    const next = await iterator.next();
    if (next.done) throw new Error(`the stream ended first: ${JSON.stringify(seen)}`);
    seen.push(next.value);
    if (wanted(next.value)) return seen;
  }
}

// The same contract for envd (in process) and for envd's front (the built program, with Node's
// envd behind it, which answers what the front leaves to it: bad input, other routes).
const VARIANTS = [
  ['envd', nodeTest],
  ["envd's front", frontTest],
] as const;

for (const [variant, test] of VARIANTS) {
  describe.skipIf(variant !== 'envd' && !existsSync(FRONT_BINARY))(variant, () => {
    describe('POST /exec', () => {
      test('streams start, each stream with its own offsets, then exit', async ({ envd }) => {
        const events = await envd.events('/exec', {
          cmd: 'echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 3',
          stdin: false,
        });
        expect(events[0].start).toMatchObject({
          command: expect.stringContaining('out1'),
          running: true,
        });
        expect(textOf(events, 'stdout')).toBe('out1\nout2\n');
        expect(textOf(events, 'stderr')).toBe('err1\nerr2\n');
        for (const stream of ['stdout', 'stderr']) {
          let offset = 0;
          for (const event of events.filter((e) => e.stream === stream)) {
            expect(event.offset).toBe(offset);
            offset = event.next;
          }
          expect(offset).toBe(10);
        }
        expect(events.at(-1)).toEqual({ exit: { code: 3, signal: null, timed_out: false } });
      });

      test('a timeout kills the whole group, keeps the output and says so', async ({ envd }) => {
        const pidFile = join(dir, 'timeout-child.pid');
        const events = await envd.events('/exec', {
          cmd: `sleep 300 & echo $! > ${pidFile}; echo partial; echo oops >&2; sleep 300`,
          timeout: 0.3,
        });
        expect(textOf(events, 'stdout')).toBe('partial\n');
        expect(textOf(events, 'stderr')).toBe('oops\n');
        expect(events.at(-1)).toEqual({ exit: { code: null, signal: 'SIGKILL', timed_out: true } });
        const child = Number(readFileSync(pidFile, 'utf8'));
        await eventually(() => !isAlive(child));
      });

      test('stdin is open for /process/{id}/stdin unless stdin is false', async ({ envd }) => {
        const open = await envd.open('/exec', { cmd: 'read line; echo "got $line"' });
        const [start] = await readUntil(open, (e) => 'start' in e);
        await envd.call(`/process/${start.start.id}/stdin`, { body: { data: 'hi\n', eof: true } });
        const rest = await readUntil(open, (e) => 'exit' in e);
        expect(textOf(rest, 'stdout')).toBe('got hi\n');
        const closed = await envd.events('/exec', { cmd: 'cat; echo done', stdin: false });
        expect(textOf(closed, 'stdout')).toBe('done\n');
      });

      test('bad arguments and a missing cwd are 400', async ({ envd }) => {
        const negative = await envd.call('/exec', { body: { cmd: 'true', timeout: -1 } });
        expect(negative.status).toBe(400);
        const nowhere = await envd.call('/exec', { body: { cmd: 'true', cwd: join(dir, 'nope') } });
        expect(nowhere.json).toMatchObject({ type: 'InvalidPathError' });
      });

      test('argv runs a program with its arguments as given, no shell in between', async ({
        envd,
      }) => {
        const argv = ['printf', '%s|', 'a b', '$HOME', "it's", '*', '; exit 9'];
        const events = await envd.events('/exec', { argv, stdin: false });
        // Each word arrives literally: nothing expanded, split, globbed or run.
        expect(textOf(events, 'stdout')).toBe("a b|$HOME|it's|*|; exit 9|");
        expect(events.at(-1)).toEqual({ exit: { code: 0, signal: null, timed_out: false } });
        // Listed as the shell line that runs exactly that program.
        expect(events[0].start.command).toBe(
          `exec 'printf' '%s|' 'a b' '$HOME' 'it'\\''s' '*' '; exit 9'`,
        );
        // The program is the process: its parent is envd, not a shell.
        const parent = await envd.events('/exec', {
          argv: ['sh', '-c', 'echo $PPID'],
          stdin: false,
        });
        expect(Number(textOf(parent, 'stdout'))).toBe(envd.pid);
      });

      test('argv: neither or both of cmd and argv, a bad list or a missing program are 400', async ({
        envd,
      }) => {
        const cases: [unknown, RegExp][] = [
          [{}, /exactly one of them/],
          [{ cmd: 'true', argv: ['true'] }, /exactly one of them/],
          [{ argv: [] }, /argv must be a non-empty array of strings/],
          [{ argv: [''] }, /argv must be a non-empty array/],
          [{ argv: ['echo', 'a\0b'] }, /without NUL/],
          [{ argv: 'echo hi' }, /argv must be a non-empty array/],
          [{ argv: ['echo', 3] }, /argv must be a non-empty array/],
          [{ argv: [join(dir, 'no-such-program')] }, /cannot start .*no-such-program: .*ENOENT/],
        ];
        for (const [body, message] of cases) {
          const answer = await envd.call('/exec', { body });
          expect(answer.status, JSON.stringify(body)).toBe(400);
          expect(JSON.stringify(answer.json)).toMatch(message);
        }
      });

      test('a character split across writes arrives whole', async ({ envd }) => {
        const events = await envd.events('/exec', {
          cmd: "printf '\\342\\202'; sleep 0.2; printf '\\254\\n'",
        });
        expect(textOf(events, 'stdout')).toBe('€\n');
      });
    });

    describe('POST /exec/warmup', () => {
      test('runs true as /exec does, but no process list or later id shows it', async ({
        envd,
      }) => {
        const before = await envd.events('/exec', { cmd: 'true', stdin: false });
        const listed = (await envd.call('/process')).json;
        const warm = await envd.events('/exec/warmup', {});
        expect(warm[0].start).toMatchObject({ command: 'true' });
        expect(warm.at(-1)).toEqual({ exit: { code: 0, signal: null, timed_out: false } });
        expect((await envd.call('/process')).json).toEqual(listed);
        const after = await envd.events('/exec', { cmd: 'true', stdin: false });
        const number = (events: Event[]) => Number(String(events[0].start.id).slice(1));
        expect(number(after)).toBe(number(before) + 1);
      });
    });

    describe('GET /exec/{id}/events', () => {
      test('output written while no client is attached is replayed in full', async ({ envd }) => {
        const abort = new AbortController();
        const open = await envd.open(
          '/exec',
          { cmd: 'read x; for i in 1 2 3; do echo line$i; echo e$i >&2; done' },
          abort.signal,
        );
        const [start] = await readUntil(open, (e) => 'start' in e);
        const { id } = start.start;
        abort.abort();
        await envd.call(`/process/${id}/stdin`, { body: { data: 'go\n' } });
        await eventually(async () => !(await envd.call(`/process/${id}`)).json.running);
        const events = await envd.events(`/exec/${id}/events`);
        expect(textOf(events, 'stdout')).toBe('line1\nline2\nline3\n');
        expect(textOf(events, 'stderr')).toBe('e1\ne2\ne3\n');
        expect(events.at(-1)).toEqual({ exit: { code: 0, signal: null, timed_out: false } });
      });

      test('resumes from per-stream offsets', async ({ envd }) => {
        const first = await envd.events('/exec', { cmd: 'echo abcdef; echo 12345 >&2' });
        const { id } = first[0].start;
        const rest = await envd.events(`/exec/${id}/events?stdout_offset=3&stderr_offset=5`);
        expect(rest).toEqual([
          { stream: 'stdout', data: 'def\n', offset: 3, next: 7 },
          { stream: 'stderr', data: '\n', offset: 5, next: 6 },
          { exit: { code: 0, signal: null, timed_out: false } },
        ]);
      });

      test('follows a running process live; follow=false stops at the output so far', async ({
        envd,
      }) => {
        const { json } = await envd.call('/process/start', {
          body: { cmd: 'echo before; read x; echo "after $x"' },
        });
        const follow = await envd.open(`/exec/${json.id}/events`);
        const before = await readUntil(follow, (e) => e.stream === 'stdout');
        expect(textOf(before, 'stdout')).toBe('before\n');
        const snapshot = await envd.events(`/exec/${json.id}/events?follow=false`);
        expect(snapshot).toEqual([{ stream: 'stdout', data: 'before\n', offset: 0, next: 7 }]);
        await envd.call(`/process/${json.id}/stdin`, { body: { data: 'go\n' } });
        const after = await readUntil(follow, (e) => 'exit' in e);
        expect(textOf(after, 'stdout')).toBe('after go\n');
      });

      test('past the cap the oldest output is dropped with a marker', async ({ envd }) => {
        const total = STREAM_LOG_BYTES + 1024 * 1024;
        const first = await envd.events('/exec', {
          cmd: `head -c ${total} /dev/zero | tr '\\0' a; echo tail >&2`,
        });
        expect(textOf(first, 'stdout')).toHaveLength(total);
        const replay = await envd.events(`/exec/${first[0].start.id}/events`);
        const [marker, ...rest] = replay;
        expect(marker).toMatchObject({ stream: 'stdout', offset: marker.dropped });
        expect(marker.dropped).toBeGreaterThanOrEqual(total - STREAM_LOG_BYTES);
        expect(marker.dropped).toBeLessThanOrEqual(total - STREAM_LOG_BYTES + 64 * 1024);
        expect(textOf(rest, 'stdout')).toHaveLength(total - marker.dropped);
        expect(textOf(rest, 'stderr')).toBe('tail\n');
      });

      test('unknown ids are 404, negative offsets 400', async ({ envd }) => {
        expect((await envd.call('/exec/p999/events')).status).toBe(404);
        const { json } = await envd.call('/process/start', { body: { cmd: 'true' } });
        const bad = await envd.call(`/exec/${json.id}/events?stderr_offset=-1`);
        expect(bad.status).toBe(400);
      });

      test(`only the newest ${FINISHED_KEPT} finished processes are kept`, async ({ envd }) => {
        const ids: string[] = [];
        for (let i = 0; i <= FINISHED_KEPT; i++) {
          const events = await envd.events('/exec', { cmd: `echo ${i}`, stdin: false });
          ids.push(events[0].start.id);
        }
        expect((await envd.call(`/process/${ids[0]}`)).status).toBe(404);
        const kept = await envd.events(`/exec/${ids[1]}/events`);
        expect(textOf(kept, 'stdout')).toBe('1\n');
      });
    });

    /** The bytes of one stream, from `output=base64` events (each must say its encoding). */
    function bytesOf(events: readonly Event[], stream: 'stdout' | 'stderr'): Buffer {
      const data = events.filter((e) => e.stream === stream && 'data' in e);
      for (const e of data) expect(e.encoding).toBe('base64');
      return Buffer.concat(data.map((e) => Buffer.from(e.data, 'base64')));
    }

    describe('output=base64: the bytes as written', () => {
      const NOT_UTF8 =
        "printf '\\377\\376\\000A'; printf 'e\\342\\202' >&2; sleep 0.2; printf '\\254\\200' >&2";

      test('POST /exec carries bytes that are not UTF-8 exactly; the default still gives text', async ({
        envd,
      }) => {
        const raw = await envd.events('/exec', { cmd: NOT_UTF8, stdin: false, output: 'base64' });
        expect(bytesOf(raw, 'stdout')).toEqual(Buffer.from([0xff, 0xfe, 0x00, 0x41]));
        // A lone continuation byte after the euro sign: kept, not replaced.
        expect(bytesOf(raw, 'stderr')).toEqual(Buffer.from([0x65, 0xe2, 0x82, 0xac, 0x80]));
        for (const stream of ['stdout', 'stderr']) {
          let offset = 0;
          for (const event of raw.filter((e) => e.stream === stream)) {
            expect(event.offset).toBe(offset);
            offset = event.next;
          }
          expect(offset).toBe(stream === 'stdout' ? 4 : 5);
        }
        expect(raw.at(-1)).toEqual({ exit: { code: 0, signal: null, timed_out: false } });
        const text = await envd.events('/exec', { cmd: NOT_UTF8, stdin: false });
        expect(textOf(text, 'stdout')).toBe('\uFFFD\uFFFD\u0000A');
        expect(textOf(text, 'stderr')).toBe('e€\uFFFD');
        expect(text.some((e) => 'encoding' in e)).toBe(false);
      });

      test('GET /exec/{id}/events?output=base64 replays bytes from an offset', async ({ envd }) => {
        const first = await envd.events('/exec', { cmd: NOT_UTF8, stdin: false });
        const { id } = first[0].start;
        const rest = await envd.events(
          `/exec/${id}/events?output=base64&stdout_offset=1&stderr_offset=2`,
        );
        expect(bytesOf(rest, 'stdout')).toEqual(Buffer.from([0xfe, 0x00, 0x41]));
        expect(bytesOf(rest, 'stderr')).toEqual(Buffer.from([0x82, 0xac, 0x80]));
        expect(rest.filter((e) => e.stream === 'stdout')[0]).toMatchObject({ offset: 1 });
      });

      test('megabytes of random bytes arrive complete, in events of at most 64 KiB', async ({
        envd,
      }) => {
        const file = join(dir, 'random.bin');
        const events = await envd.events('/exec', {
          cmd: `head -c 3000000 /dev/urandom > ${file}; cat ${file}`,
          stdin: false,
          output: 'base64',
        });
        const got = bytesOf(events, 'stdout');
        expect(got.length).toBe(3_000_000);
        const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
        expect(sha(got)).toBe(sha(readFileSync(file)));
        const sizes = events.filter((e) => e.stream === 'stdout').map((e) => e.next - e.offset);
        expect(Math.max(...sizes)).toBeLessThanOrEqual(64 * 1024);
      });

      test('an unknown output is 400 naming the choices, and nothing runs', async ({ envd }) => {
        const marker = join(dir, 'ran-with-bad-output');
        const bad = await envd.call('/exec', { body: { cmd: `touch ${marker}`, output: 'hex' } });
        expect(bad.status).toBe(400);
        expect(bad.json.error).toContain('output must be "text" or "base64", not "hex"');
        const { json } = await envd.call('/process/start', { body: { cmd: 'true' } });
        const replay = await envd.call(`/exec/${json.id}/events?output=utf16`);
        expect(replay.status).toBe(400);
        expect(() => readFileSync(marker)).toThrow(/ENOENT/);
      });
    });

    describe('processes as another user (envd as root: an image build)', () => {
      test.runIf(process.getuid?.() === 0)(
        'exec and runshell take a user from /etc/passwd; an unknown one is a 404',
        async ({ envd }) => {
          const events = await envd.events('/exec', {
            cmd: 'id -u; echo $HOME',
            user: 'nobody',
            stdin: false,
          });
          expect(textOf(events, 'stdout')).toBe('65534\n/nonexistent\n');
          const shell = await envd.call('/process/exec', {
            body: { cmd: 'id -un', user: 'nobody' },
          });
          expect(shell.json).toMatchObject({ stdout: 'nobody\n', exit_code: 0 });
          const unknown = await envd.call('/process/exec', {
            body: { cmd: 'id', user: 'no-such-user' },
          });
          expect(unknown.status).toBe(404);
          expect(unknown.json).toMatchObject({ type: 'NotFoundError' });
        },
      );
    });
  });
}
