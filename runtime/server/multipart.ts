import { BadRequestError } from '../protocol/errors.js';

/** One part of a `multipart/form-data` body, its bytes read as they arrive. */
export interface FormPart {
  /** The `name` of its Content-Disposition. */
  name: string;
  /** Its `filename`, when it has one. */
  filename: string | undefined;
  /**
   * Its bytes, up to the next boundary. Read it before asking for the next part (what is not
   * read is skipped then); it throws a {@link MultipartError} if the body ends inside the part.
   */
  data: AsyncIterable<Buffer>;
}

/** A body that is not the multipart form its Content-Type says (a 400 where a server answers it). */
export class MultipartError extends BadRequestError {
  constructor(message: string) {
    super(`the multipart body could not be read: ${message}`, { code: 'bad_multipart' });
    this.name = 'MultipartError';
  }
}

/** Most parts one body may hold. */
export const MAX_PARTS = 1000;

/** Most bytes of one part's headers (the SDKs send one short Content-Disposition line). */
export const MAX_PART_HEAD_BYTES = 16 * 1024;

/** The boundary of a `multipart/form-data` Content-Type (RFC 2046: 1 to 70 characters). */
export function boundaryOf(contentType: string): string {
  if (!/^multipart\/form-data\s*(;|$)/i.test(contentType)) {
    throw new MultipartError(
      `Content-Type ${JSON.stringify(contentType.slice(0, 100))} is not multipart/form-data`,
    );
  }
  const match = /;\s*boundary=(?:"([^"]{1,70})"|([^\s;"]{1,70}))\s*(?:;|$)/i.exec(contentType);
  const boundary = match?.[1] ?? match?.[2];
  if (!boundary)
    throw new MultipartError('the Content-Type names no boundary (1 to 70 characters)');
  return boundary;
}

/** The parameters a part's Content-Disposition is read for, quoted or not (compiled once). */
const PARAMETERS = {
  name: /;\s*name=(?:"((?:[^"\\]|\\.)*)"|([^;\s"]*))/i,
  filename: /;\s*filename=(?:"((?:[^"\\]|\\.)*)"|([^;\s"]*))/i,
};

/** A header parameter (`name="x"`) of a Content-Disposition, quoted or not. */
function parameter(disposition: string, key: keyof typeof PARAMETERS): string | undefined {
  const match = PARAMETERS[key].exec(disposition);
  if (!match) return undefined;
  return match[1] !== undefined ? match[1].replace(/\\(.)/g, '$1') : match[2];
}

/** The name and filename a part's header lines give, or a {@link MultipartError}. */
function partHead(headText: string): { name: string; filename: string | undefined } {
  let disposition: string | undefined;
  if (headText !== '') {
    for (const line of headText.split('\r\n')) {
      const colon = line.indexOf(':');
      if (colon <= 0) throw new MultipartError('a part header is not `name: value`');
      if (line.slice(0, colon).trim().toLowerCase() === 'content-disposition') {
        disposition = line.slice(colon + 1).trim();
      }
    }
  }
  if (!disposition || !/^form-data\s*(;|$)/i.test(disposition)) {
    throw new MultipartError('a part has no Content-Disposition: form-data');
  }
  const name = parameter(disposition, 'name');
  if (name === undefined) throw new MultipartError('a part has no name');
  return { name, filename: parameter(disposition, 'filename') };
}

/**
 * The body's bytes not handled yet. Only a tail shorter than the delimiter (which may be its
 * start, split across reads) or one part's headers are ever held, whatever the body's size.
 */
class Bytes {
  buf: Buffer = Buffer.alloc(0);
  private ended = false;
  private readonly source: AsyncIterator<Uint8Array>;

  constructor(source: AsyncIterable<Uint8Array>) {
    this.source = source[Symbol.asyncIterator]();
  }

  /** Reads once more from the body; false when it has ended. */
  async more(): Promise<boolean> {
    while (!this.ended) {
      const item = await this.source.next();
      if (item.done) {
        this.ended = true;
        break;
      }
      const chunk = Buffer.isBuffer(item.value)
        ? item.value
        : Buffer.from(item.value.buffer, item.value.byteOffset, item.value.byteLength);
      if (chunk.length === 0) continue;
      this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
      return true;
    }
    return false;
  }

  /** The body's next chunk as it came, not joined to what is held; undefined at its end. */
  async take(): Promise<Buffer | undefined> {
    while (!this.ended) {
      const item = await this.source.next();
      if (item.done) {
        this.ended = true;
        break;
      }
      const chunk = Buffer.isBuffer(item.value)
        ? item.value
        : Buffer.from(item.value.buffer, item.value.byteOffset, item.value.byteLength);
      if (chunk.length > 0) return chunk;
    }
    return undefined;
  }

  /** At least `n` bytes are held, unless the body ended first. */
  async need(n: number): Promise<void> {
    while (this.buf.length < n && (await this.more())) {
      // read on
    }
  }

  skip(n: number): void {
    this.buf = this.buf.subarray(n);
  }

  /** Stops the body's source (a reader that gives up early). */
  async close(): Promise<void> {
    if (!this.ended) await this.source.return?.();
    this.ended = true;
  }
}

/**
 * The parts of a `multipart/form-data` body (RFC 7578), read as the body arrives: each part's
 * bytes are handed on in pieces, so a form of any size is read in bounded memory. Strict: anything
 * that does not frame as the boundary says is a {@link MultipartError}, never a guess. What follows
 * the closing delimiter is read and dropped.
 */
export async function* readMultipart(
  source: AsyncIterable<Uint8Array>,
  boundary: string,
): AsyncGenerator<FormPart> {
  const delimiter = Buffer.from(`--${boundary}`);
  // Inside a part, the delimiter is preceded by the CRLF that ends the part's data.
  const end = Buffer.from(`\r\n--${boundary}`);
  const bytes = new Bytes(source);
  try {
    // The preamble, before the first delimiter, is dropped.
    for (;;) {
      const at = bytes.buf.indexOf(delimiter);
      if (at >= 0) {
        bytes.skip(at + delimiter.length);
        break;
      }
      bytes.skip(Math.max(0, bytes.buf.length - (delimiter.length - 1)));
      if (!(await bytes.more())) throw new MultipartError('the boundary never appears');
    }
    for (let count = 1; ; count++) {
      // `--` after a delimiter closes the body; what follows is the epilogue.
      await bytes.need(2);
      if (bytes.buf[0] === 0x2d && bytes.buf[1] === 0x2d) {
        while (await bytes.more()) bytes.skip(bytes.buf.length);
        return;
      }
      // Transport padding (spaces, tabs) may follow a delimiter before its CRLF.
      for (;;) {
        let k = 0;
        while (k < bytes.buf.length && (bytes.buf[k] === 0x20 || bytes.buf[k] === 0x09)) k++;
        bytes.skip(k);
        if (bytes.buf.length > 0 || !(await bytes.more())) break;
      }
      await bytes.need(2);
      if (bytes.buf[0] !== 0x0d || bytes.buf[1] !== 0x0a) {
        throw new MultipartError('a boundary line does not end with CRLF');
      }
      bytes.skip(2);
      await bytes.need(2);
      let headText = '';
      if (bytes.buf[0] === 0x0d && bytes.buf[1] === 0x0a) {
        // A part without headers starts with its blank line at once.
        bytes.skip(2);
      } else {
        for (;;) {
          const headEnd = bytes.buf.indexOf('\r\n\r\n');
          if (headEnd >= 0) {
            headText = bytes.buf.toString('latin1', 0, headEnd);
            bytes.skip(headEnd + 4);
            break;
          }
          if (bytes.buf.length > MAX_PART_HEAD_BYTES) {
            throw new MultipartError(`a part's headers are over ${MAX_PART_HEAD_BYTES} bytes`);
          }
          if (!(await bytes.more())) throw new MultipartError('a part has no end to its headers');
        }
      }
      const head = partHead(headText);
      if (count > MAX_PARTS) throw new MultipartError(`over ${MAX_PARTS} parts`);
      let open = true;
      /** The part's next piece, or undefined at its closing delimiter. */
      const nextPiece = async (): Promise<Buffer | undefined> => {
        while (open) {
          const at = bytes.buf.indexOf(end);
          if (at >= 0) {
            const piece = bytes.buf.subarray(0, at);
            // Left at the delimiter itself (its CRLF belongs to the part's end).
            bytes.skip(at + 2);
            open = false;
            if (piece.length > 0) return piece;
            break;
          }
          // All but a tail that may be the start of the delimiter is the part's.
          const safe = bytes.buf.length - (end.length - 1);
          if (safe > 0) {
            const piece = bytes.buf.subarray(0, safe);
            bytes.skip(safe);
            return piece;
          }
          if (bytes.buf.length === 0) {
            if (!(await bytes.more()))
              throw new MultipartError('a part is not closed by the boundary');
            continue;
          }
          // A tail shorter than the delimiter is held: rather than join it to the next chunk (a
          // copy of every byte of the part), look for a delimiter that starts in the tail in the
          // tail and the chunk's first bytes alone. When none does, the tail is the part's.
          const tail = bytes.buf;
          const chunk = await bytes.take();
          if (chunk === undefined) throw new MultipartError('a part is not closed by the boundary');
          const window = Buffer.concat([tail, chunk.subarray(0, end.length - 1)]);
          const found = window.indexOf(end);
          if (chunk.length < end.length - 1 || (found >= 0 && found < tail.length)) {
            bytes.buf = Buffer.concat([tail, chunk]);
            continue;
          }
          bytes.buf = chunk;
          return tail;
        }
        return undefined;
      };
      const data: AsyncIterable<Buffer> = {
        [Symbol.asyncIterator]: () => ({
          next: async () => {
            const piece = await nextPiece();
            return piece === undefined
              ? { done: true, value: undefined }
              : { done: false, value: piece };
          },
        }),
      };
      yield { ...head, data };
      // What the reader left of the part is skipped.
      while ((await nextPiece()) !== undefined) {
        // skip
      }
      bytes.skip(delimiter.length);
    }
  } finally {
    await bytes.close();
  }
}

/** One part of a whole (small) `multipart/form-data` body: its bytes, at once. */
export interface WholePart {
  name: string;
  filename: string | undefined;
  data: Buffer;
}

/**
 * The parts of a body held whole (a small upload): what {@link readMultipart} reads from the same
 * bytes, with the same errors, parsed in one pass without its asynchronous steps. A part is given
 * once its closing delimiter is found, so a form that breaks gives the parts before the break,
 * then throws.
 */
export function* wholeFormParts(body: Buffer, boundary: string): Generator<WholePart> {
  const delimiter = Buffer.from(`--${boundary}`);
  const end = Buffer.from(`\r\n--${boundary}`);
  const first = body.indexOf(delimiter);
  if (first < 0) throw new MultipartError('the boundary never appears');
  let pos = first + delimiter.length;
  for (let count = 1; ; count++) {
    // `--` after a delimiter closes the body; what follows is the epilogue.
    if (body[pos] === 0x2d && body[pos + 1] === 0x2d) return;
    // Transport padding (spaces, tabs) may follow a delimiter before its CRLF.
    while (body[pos] === 0x20 || body[pos] === 0x09) pos++;
    if (body[pos] !== 0x0d || body[pos + 1] !== 0x0a) {
      throw new MultipartError('a boundary line does not end with CRLF');
    }
    pos += 2;
    let headText = '';
    if (body[pos] === 0x0d && body[pos + 1] === 0x0a) {
      // A part without headers starts with its blank line at once.
      pos += 2;
    } else {
      const headEnd = body.indexOf('\r\n\r\n', pos);
      if (headEnd < 0) {
        throw new MultipartError(
          body.length - pos > MAX_PART_HEAD_BYTES
            ? `a part's headers are over ${MAX_PART_HEAD_BYTES} bytes`
            : 'a part has no end to its headers',
        );
      }
      headText = body.toString('latin1', pos, headEnd);
      pos = headEnd + 4;
    }
    const head = partHead(headText);
    if (count > MAX_PARTS) throw new MultipartError(`over ${MAX_PARTS} parts`);
    const close = body.indexOf(end, pos);
    if (close < 0) throw new MultipartError('a part is not closed by the boundary');
    const data = body.subarray(pos, close);
    pos = close + end.length;
    yield { ...head, data };
  }
}
