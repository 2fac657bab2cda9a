import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { boundaryOf, MultipartError, parseMultipart } from '../../../src/compat/e2b/multipart.js';

// The reader of E2B's `/files` upload forms: round trips and fuzzed bodies (fixed seed).
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

describe('multipart reader', () => {
  test('reads back what a form holds, whatever the bytes', () => {
    const boundary = 'b0undary-4f1c9e';
    const word = fc.stringMatching(/^[a-z0-9/._-]{1,20}$/);
    fc.assert(
      fc.property(
        fc.array(
          fc.record({ name: word, filename: word, data: fc.uint8Array({ maxLength: 200 }) }),
          {
            minLength: 1,
            maxLength: 5,
          },
        ),
        (parts) => {
          const input = parts.map((p) => ({ ...p, data: Buffer.from(p.data) }));
          // A body holding the boundary itself is not a form a client can send.
          fc.pre(input.every((p) => !p.data.includes(`--${boundary}`)));
          const read = parseMultipart(form(boundary, input), boundary);
          expect(read.map((p) => [p.name, p.filename, Buffer.from(p.data)])).toEqual(
            input.map((p) => [p.name, p.filename, p.data]),
          );
        },
      ),
      { seed: SEED, numRuns: 300 },
    );
  });

  test('a fuzzed body is parts or a MultipartError, never anything else', () => {
    const boundary = 'xyz';
    const chunk = fc.oneof(
      fc.uint8Array({ maxLength: 30 }).map((b) => Buffer.from(b)),
      fc
        .constantFrom(
          '--xyz',
          '--xyz--',
          '\r\n',
          '\r\n\r\n',
          'Content-Disposition: form-data; name="file"',
          '; filename="/a"',
          ' ',
          ':',
        )
        .map((s) => Buffer.from(s)),
    );
    fc.assert(
      fc.property(fc.array(chunk, { maxLength: 20 }), (chunks) => {
        try {
          const parts = parseMultipart(Buffer.concat(chunks), boundary);
          expect(Array.isArray(parts)).toBe(true);
        } catch (error) {
          expect(error).toBeInstanceOf(MultipartError);
        }
      }),
      { seed: SEED, numRuns: 2000 },
    );
  });

  test('the boundary comes from the Content-Type, or a clear error', () => {
    expect(boundaryOf('multipart/form-data; boundary=abc')).toBe('abc');
    expect(boundaryOf('multipart/form-data; boundary="a b"')).toBe('a b');
    expect(() => boundaryOf('multipart/form-data')).toThrow(/names no boundary/);
    expect(() => boundaryOf('text/plain; boundary=x')).toThrow(/is not multipart\/form-data/);
  });
});
