/** One part of a `multipart/form-data` body. */
export interface FormPart {
  /** The `name` of its Content-Disposition. */
  name: string;
  /** Its `filename`, when it has one. */
  filename: string | undefined;
  data: Buffer;
}

/** A body that is not the multipart form its Content-Type says. */
export class MultipartError extends Error {
  constructor(message: string) {
    super(`the multipart body could not be read: ${message}`);
    this.name = 'MultipartError';
  }
}

/** Most parts one body may hold. */
export const MAX_PARTS = 1000;

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

/** A header parameter (`name="x"`) of a Content-Disposition, quoted or not. */
function parameter(disposition: string, key: string): string | undefined {
  const match = new RegExp(`;\\s*${key}=(?:"((?:[^"\\\\]|\\\\.)*)"|([^;\\s"]*))`, 'i').exec(
    disposition,
  );
  if (!match) return undefined;
  return match[1] !== undefined ? match[1].replace(/\\(.)/g, '$1') : match[2];
}

/**
 * The parts of a whole `multipart/form-data` body (RFC 7578). Strict: anything that does not
 * frame as the boundary says is a {@link MultipartError}, never a guess.
 */
export function parseMultipart(body: Buffer, boundary: string): FormPart[] {
  const delimiter = Buffer.from(`--${boundary}`);
  const parts: FormPart[] = [];
  let pos = body.indexOf(delimiter);
  if (pos < 0) throw new MultipartError('the boundary never appears');
  for (;;) {
    pos += delimiter.length;
    // `--` after a delimiter closes the body.
    if (body[pos] === 0x2d && body[pos + 1] === 0x2d) return parts;
    // Transport padding (spaces, tabs) may follow a delimiter before its CRLF.
    while (body[pos] === 0x20 || body[pos] === 0x09) pos++;
    if (body[pos] !== 0x0d || body[pos + 1] !== 0x0a) {
      throw new MultipartError('a boundary line does not end with CRLF');
    }
    pos += 2;
    const headEnd = body.indexOf('\r\n\r\n', pos);
    // A part without headers starts with its blank line at once.
    const bare = body[pos] === 0x0d && body[pos + 1] === 0x0a;
    if (!bare && headEnd < 0) throw new MultipartError('a part has no end to its headers');
    const headText = bare ? '' : body.toString('latin1', pos, headEnd);
    pos = bare ? pos + 2 : headEnd + 4;
    const next = body.indexOf(Buffer.concat([Buffer.from('\r\n'), delimiter]), pos);
    if (next < 0) throw new MultipartError('a part is not closed by the boundary');
    let disposition: string | undefined;
    for (const line of headText.split('\r\n')) {
      const colon = line.indexOf(':');
      if (colon <= 0) throw new MultipartError('a part header is not `name: value`');
      if (line.slice(0, colon).trim().toLowerCase() === 'content-disposition') {
        disposition = line.slice(colon + 1).trim();
      }
    }
    if (!disposition || !/^form-data\s*(;|$)/i.test(disposition)) {
      throw new MultipartError('a part has no Content-Disposition: form-data');
    }
    const name = parameter(disposition, 'name');
    if (name === undefined) throw new MultipartError('a part has no name');
    parts.push({
      name,
      filename: parameter(disposition, 'filename'),
      data: body.subarray(pos, next),
    });
    if (parts.length > MAX_PARTS) throw new MultipartError(`over ${MAX_PARTS} parts`);
    pos = next + 2;
  }
}
