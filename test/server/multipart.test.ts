import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import {
  boundaryOf,
  MAX_PART_HEAD_BYTES,
  MultipartError,
  readMultipart,
  wholeFormParts,
} from '../../runtime/server/multipart.js';

// The streaming reader of upload forms (envd's `POST /files/upload`, E2B's `POST /files`): round trips over random chunkings, and
// fuzzed bodies (fixed seed) that must give parts or a MultipartError, and never hang.
const SEED = 20261202;

function form(boundary: string, parts: { name: string; filename?: string; data: Buffer }[]) {
  const pieces: Buffer[] = [];
  for (const p of parts) {
    const file = p.filename === undefined ? '' : `; filename="${p.filename}"`;
    pieces.push(
      Buffer.from(
        `--${boundary}\r\nContent-Disposition: form-data; name="${p.name}"${file}\r\n\r\n`,
      ),
      p.data,
      Buffer.from('\r\n'),
    );
  }
  pieces.push(Buffer.from(`--${boundary}--\r\n`));
  return Buffer.concat(pieces);
}

/** `body` cut at `cuts` (positions, any order), as the chunks a socket might deliver. */
async function* chunked(body: Buffer, cuts: number[]): AsyncGenerator<Uint8Array> {
  const at = [...new Set(cuts.map((c) => c % (body.length + 1)))].sort((a, b) => a - b);
  let from = 0;
  for (const to of [...at, body.length]) {
    // A Uint8Array view, not a Buffer: the reader takes either.
    yield new Uint8Array(body.buffer, body.byteOffset + from, to - from);
    from = to;
  }
}

/** A piece of a fuzzed body (boundary `xyz`): random bytes, or one of the tokens forms are made of. */
function fuzzPiece(maxBytes: number) {
  return fc.oneof(
    fc.uint8Array({ maxLength: maxBytes }).map((b) => Buffer.from(b)),
    fc
      .constantFrom(
        '--xyz',
        '--xyz--',
        '\r\n',
        '\r\n\r\n',
        'Content-Disposition: form-data; name="file"',
        '; filename="/a"',
        '; name=x',
        ' ',
        '\t',
        ':',
        '-',
      )
      .map((s) => Buffer.from(s)),
  );
}

/** Every part with its bytes, read as a consumer reads them (each part's data in turn). */
async function readAll(source: AsyncIterable<Uint8Array>, boundary: string) {
  const parts: { name: string; filename: string | undefined; data: Buffer }[] = [];
  for await (const part of readMultipart(source, boundary)) {
    const pieces: Buffer[] = [];
    for await (const piece of part.data) pieces.push(Buffer.from(piece));
    parts.push({ name: part.name, filename: part.filename, data: Buffer.concat(pieces) });
  }
  return parts;
}

/** Fails instead of hanging: the reader must end on every body. */
function bounded<T>(work: Promise<T>): Promise<T> {
  return Promise.race([
    work,
    new Promise<T>((_, reject) =>
      setTimeout(() => reject(new Error('the reader did not end')), 5_000).unref(),
    ),
  ]);
}

describe('multipart reader', () => {
  test('reads back what a form holds, whatever the bytes and however they are cut', async () => {
    const boundary = 'b0undary-4f1c9e';
    const word = fc.stringMatching(/^[a-z0-9/._-]{1,20}$/);
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.record({ name: word, filename: word, data: fc.uint8Array({ maxLength: 200 }) }),
          { minLength: 1, maxLength: 5 },
        ),
        fc.array(fc.nat(), { maxLength: 40 }),
        async (parts, cuts) => {
          const input = parts.map((p) => ({ ...p, data: Buffer.from(p.data) }));
          // A body holding the boundary itself is not a form a client can send.
          fc.pre(input.every((p) => !p.data.includes(`--${boundary}`)));
          const read = await bounded(readAll(chunked(form(boundary, input), cuts), boundary));
          expect(read.map((p) => [p.name, p.filename, p.data])).toEqual(
            input.map((p) => [p.name, p.filename, p.data]),
          );
        },
      ),
      { seed: SEED, numRuns: 300 },
    );
  });

  test('one byte at a time, and a part the reader skips', async () => {
    const body = form('xyz', [
      { name: 'note', data: Buffer.from('skipped\r\n--xy') },
      { name: 'file', filename: '/a/b.txt', data: Buffer.from('-\r\n-x\r\n--xy') },
    ]);
    const seen: [string, string][] = [];
    const cuts = [...Array(body.length).keys()];
    for await (const part of readMultipart(chunked(body, cuts), 'xyz')) {
      if (part.name !== 'file') continue;
      const pieces: Buffer[] = [];
      for await (const piece of part.data) pieces.push(piece);
      seen.push([part.filename as string, Buffer.concat(pieces).toString()]);
    }
    expect(seen).toEqual([['/a/b.txt', '-\r\n-x\r\n--xy']]);
  });

  test('a large part goes through in pieces, never held whole', async () => {
    const part = Buffer.alloc(8 * 1024 * 1024, 7);
    const body = form('big', [{ name: 'file', filename: 'f', data: part }]);
    // 64 KiB reads, as a socket gives them.
    const cuts = Array.from({ length: Math.ceil(body.length / 65536) }, (_, i) => i * 65536);
    let largest = 0;
    let total = 0;
    for await (const p of readMultipart(chunked(body, cuts), 'big')) {
      for await (const piece of p.data) {
        largest = Math.max(largest, piece.length);
        total += piece.length;
      }
    }
    expect(total).toBe(part.length);
    expect(largest).toBeLessThanOrEqual(65536 + 64);
  });

  test("a large part's bytes are handed on as views of the body's chunks, not copied", async () => {
    const part = Buffer.alloc(4 * 1024 * 1024, 7);
    const body = form('big', [{ name: 'file', filename: 'f', data: part }]);
    const cuts = Array.from({ length: Math.ceil(body.length / 65536) }, (_, i) => i * 65536);
    // Each chunk a Buffer of its own memory, as a socket's reads are.
    const chunks = [...cuts, body.length]
      .slice(1)
      .map((to, i) => Buffer.from(body.subarray(cuts[i], to)));
    const owners = new Set(chunks.map((c) => c.buffer));
    let copied = 0;
    for await (const p of readMultipart(
      (async function* () {
        yield* chunks;
      })(),
      'big',
    )) {
      for await (const piece of p.data) {
        if (!owners.has(piece.buffer as ArrayBuffer)) copied += piece.length;
      }
    }
    // Only the part's first bytes (after its head, in the first chunk's copy) may be joined.
    expect(copied).toBeLessThanOrEqual(65536);
  });

  test('a delimiter cut at any byte, after data that looks like its start, still ends the part', async () => {
    const boundary = 'b0und';
    // The part ends with bytes that begin the delimiter, over and over, then the real one.
    const data = Buffer.concat([Buffer.alloc(300, 1), Buffer.from('\r\n--b0u\r\n--b0\r\n-')]);
    const body = form(boundary, [
      { name: 'file', filename: 'a', data },
      { name: 'file', filename: 'b', data: Buffer.from('x') },
    ]);
    const end = body.indexOf(Buffer.from('\r\n--b0und\r\n'));
    for (let cut = end - 30; cut <= end + 12; cut++) {
      // 100-byte chunks up to the cut, then a cut inside or near the delimiter, then the rest.
      const cuts = [...Array.from({ length: Math.floor(cut / 100) }, (_, i) => i * 100), cut];
      const parts = await bounded(readAll(chunked(body, cuts), boundary));
      expect(parts.map((p) => [p.filename, p.data.toString('latin1')])).toEqual([
        ['a', data.toString('latin1')],
        ['b', 'x'],
      ]);
    }
  });

  test('a fuzzed body is parts or a MultipartError, never anything else, never a hang', async () => {
    const boundary = 'xyz';
    const chunk = fuzzPiece(30);
    await fc.assert(
      fc.asyncProperty(
        fc.array(chunk, { maxLength: 20 }),
        fc.array(fc.nat(), { maxLength: 10 }),
        async (chunks, cuts) => {
          try {
            const parts = await bounded(readAll(chunked(Buffer.concat(chunks), cuts), boundary));
            expect(Array.isArray(parts)).toBe(true);
          } catch (error) {
            expect(error).toBeInstanceOf(MultipartError);
          }
        },
      ),
      { seed: SEED, numRuns: 2000 },
    );
  });

  test('a body held whole is read as the streaming reader reads it: the same parts, then the same error', async () => {
    /** The parts read until the end or an error, and the error's message. */
    const streamed = async (body: Buffer, cuts: number[]) => {
      const parts: [string, string | undefined, Buffer][] = [];
      try {
        for await (const part of readMultipart(chunked(body, cuts), 'xyz')) {
          const pieces: Buffer[] = [];
          for await (const piece of part.data) pieces.push(Buffer.from(piece));
          parts.push([part.name, part.filename, Buffer.concat(pieces)]);
        }
        return { parts, error: undefined };
      } catch (error) {
        return { parts, error: (error as Error).message };
      }
    };
    const whole = (body: Buffer) => {
      const parts: [string, string | undefined, Buffer][] = [];
      try {
        for (const part of wholeFormParts(body, 'xyz')) {
          parts.push([part.name, part.filename, Buffer.from(part.data)]);
        }
        return { parts, error: undefined };
      } catch (error) {
        expect(error).toBeInstanceOf(MultipartError);
        return { parts, error: (error as Error).message };
      }
    };
    const piece = fuzzPiece(12);
    const made = fc.array(
      fc.record({
        name: fc.stringMatching(/^[a-z]{1,6}$/),
        filename: fc.option(fc.stringMatching(/^[a-z/.]{1,8}$/), { nil: undefined }),
        data: fc.uint8Array({ maxLength: 40 }).map((b) => Buffer.from(b)),
      }),
      { minLength: 1, maxLength: 4 },
    );
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.array(piece, { maxLength: 24 }).map((pieces) => Buffer.concat(pieces)),
          // Real forms, cut short or with bytes after them.
          fc.tuple(made, fc.nat(), fc.uint8Array({ maxLength: 8 })).map(([parts, at, tail]) => {
            const body = form('xyz', parts);
            return Buffer.concat([body.subarray(0, body.length - (at % 6)), Buffer.from(tail)]);
          }),
        ),
        fc.array(fc.nat(), { maxLength: 6 }),
        async (body, cuts) => {
          expect(whole(body)).toEqual(await bounded(streamed(body, cuts)));
        },
      ),
      { seed: SEED, numRuns: 3000 },
    );
  });

  test('broken forms name what is wrong', async () => {
    const read = (text: string) => readAll(chunked(Buffer.from(text), []), 'xyz').catch((e) => e);
    expect((await read('no boundary here')).message).toMatch(/the boundary never appears/);
    expect(
      (await read('--xyz\r\nContent-Disposition: form-data; name="f"\r\n\r\nopen')).message,
    ).toMatch(/a part is not closed by the boundary/);
    expect((await read('--xyz\r\nX: y\r\n\r\n\r\n--xyz--')).message).toMatch(
      /no Content-Disposition/,
    );
    expect((await read('--xyzjunk')).message).toMatch(/does not end with CRLF/);
    const longHead = `--xyz\r\nX-Long: ${'a'.repeat(MAX_PART_HEAD_BYTES + 10)}`;
    expect((await read(longHead)).message).toMatch(/headers are over/);
  });

  test('a body that throws passes its error on (a client that went away)', async () => {
    const gone = new Error('the client went away');
    async function* cut(): AsyncGenerator<Uint8Array> {
      yield Buffer.from('--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\nhalf of it');
      throw gone;
    }
    expect(await readAll(cut(), 'xyz').catch((e) => e)).toBe(gone);
  });

  test('the boundary comes from the Content-Type, or a clear error', () => {
    expect(boundaryOf('multipart/form-data; boundary=abc')).toBe('abc');
    expect(boundaryOf('multipart/form-data; boundary="a b"')).toBe('a b');
    expect(() => boundaryOf('multipart/form-data')).toThrow(/names no boundary/);
    expect(() => boundaryOf('text/plain; boundary=x')).toThrow(/is not multipart\/form-data/);
  });
});
