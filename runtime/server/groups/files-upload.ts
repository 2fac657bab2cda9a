import type { IncomingHttpHeaders } from 'node:http';
import { pipeline } from 'node:stream/promises';
import { BadRequestError, UnsupportedMediaTypeError } from '../errors.js';
import { SMALL_FILE_BYTES, safePath } from '../file-system.js';
import { boundaryOf, readMultipart, wholeFormParts } from '../multipart.js';
import type { Route } from '../route-table.js';
import { argList } from '../validate.js';

/** What a write route answers for one file. */
export interface Written {
  path: string;
  size: number;
  metadata?: Record<string, string>;
}

/** An entry of E2B's upload answer: what `POST /files` answers for each file written. */
interface E2bEntry {
  name: string;
  type: 'file';
  path: string;
  metadata?: Record<string, string>;
}

/**
 * The files written as E2B's envd answers them (`?e2b=true`): each one's name, type and path, and
 * the metadata it has now, left out when it has none. The daemon's E2B face passes this answer on
 * as bytes.
 */
function e2bEntries(files: Written[]): E2bEntry[] {
  return files.map((file) => ({
    name: file.path.slice(file.path.lastIndexOf('/') + 1),
    type: 'file',
    path: file.path,
    ...(file.metadata && Object.keys(file.metadata).length > 0 ? { metadata: file.metadata } : {}),
  }));
}

/** Writes one file atomically, keeping `metadata` with it (files.ts). */
export type WriteOne = (
  path: string,
  content: Buffer | AsyncIterable<Buffer>,
  metadata: Record<string, string>,
) => Promise<Written>;

/**
 * The body unpacked as it arrives (zlib's streaming gunzip). Nothing bounds what it expands to:
 * it goes to the sandbox's disk as it comes, so the disk's quota is the bound (the write then
 * fails with ENOSPC). A body that is not gzip is a 400.
 */
async function* gunzipped(body: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  // Loaded here, not at envd's start: only gzip uploads use it (envd's memory, issue 50).
  const gunzip = process.getBuiltinModule('node:zlib').createGunzip();
  let bodyError: unknown;
  const feeding = pipeline(async function* () {
    try {
      for await (const chunk of body) yield chunk;
    } catch (error) {
      bodyError = error;
      throw error;
    }
  }, gunzip).catch(() => undefined);
  try {
    for await (const chunk of gunzip) yield chunk as Buffer;
  } catch (error) {
    if (bodyError !== undefined) throw bodyError;
    throw new BadRequestError(
      `the gzip body could not be read: ${(error as Error).message}; send the file gzip-compressed whole, or without Content-Encoding`,
      { code: 'bad_gzip' },
    );
  } finally {
    gunzip.destroy();
    await feeding;
  }
}

/**
 * What gzip expands to, whole when it ends within {@link SMALL_FILE_BYTES} (written then without
 * the thread pool), else the same bytes as a stream that goes on with the rest (the route's own
 * `wholeIfSmall` does this for a body as it arrives).
 */
async function expandedIfSmall(
  body: AsyncIterable<Buffer>,
): Promise<Buffer | AsyncIterable<Buffer>> {
  const iterator = body[Symbol.asyncIterator]();
  const read: Buffer[] = [];
  let bytes = 0;
  for (;;) {
    const item = await iterator.next();
    if (item.done) return read.length === 1 ? (read[0] as Buffer) : Buffer.concat(read, bytes);
    read.push(item.value);
    bytes += item.value.length;
    if (bytes > SMALL_FILE_BYTES) break;
  }
  return (async function* () {
    yield* read.splice(0);
    for (let item = await iterator.next(); !item.done; item = await iterator.next()) {
      yield item.value;
    }
  })();
}

/** The header's one value (a repeated header's first). */
function headerOf(headers: IncomingHttpHeaders, name: string): string {
  const value = headers[name];
  return (Array.isArray(value) ? value[0] : value) ?? '';
}

/**
 * `POST /files/upload`: a multipart form of files (each `file` part, to `?path=` or to its
 * filename) or one raw body (to `?path=`), gzip-compressed or not, each file written atomically
 * and in turn as its bytes arrive. This is the upload E2B's SDKs send to `POST /files`, which the
 * daemon's E2B face passes on here as bytes (docs/e2b.md); browsers and `curl -F` send the same.
 * A form that breaks keeps the files of the parts before the break; the part being written when
 * it broke is not written.
 */
export function uploadRoute(
  writeOne: WriteOne,
  metadataOf: (headers: IncomingHttpHeaders) => Record<string, string>,
): Omit<Route<unknown>, 'group'> {
  return {
    method: 'POST',
    path: '/files/upload',
    summary:
      "Writes each `file` part of a multipart/form-data body (to `?path=`, else to its filename), or a raw body to `?path=`, atomically and in turn; `Content-Encoding: gzip` is unpacked as it arrives, `X-Metadata-<key>` headers go with every file. Answers `{files: [{path, size, metadata?}]}`, or with `?e2b=true` E2B's list `[{name, type, path, metadata?}]`.",
    body: 'stream',
    args: argList({ 'path?': 'str', 'e2b?': ['bool', false] }),
    handler: async ({ args, stream, wholeIfSmall, headers }) => {
      const encoding = headerOf(headers, 'content-encoding').trim().toLowerCase();
      if (encoding !== '' && encoding !== 'identity' && encoding !== 'gzip') {
        throw new UnsupportedMediaTypeError(
          `Content-Encoding ${JSON.stringify(encoding.slice(0, 40))}: send gzip or none`,
        );
      }
      const gzip = encoding === 'gzip';
      const type = headerOf(headers, 'content-type');
      const form = /^multipart\/form-data/i.test(type);
      if (!form && type !== '' && !/^application\/octet-stream/i.test(type)) {
        throw new UnsupportedMediaTypeError(
          `Content-Type ${JSON.stringify(type.slice(0, 100))}: send multipart/form-data or application/octet-stream`,
        );
      }
      const path = (args.path as string | undefined) || undefined;
      if (!form && !path) {
        throw new BadRequestError('a raw upload needs ?path= naming the file to write');
      }
      // Checked before a byte is written: a refused set leaves every file as it was.
      const metadata = metadataOf(headers);
      const boundary = form ? boundaryOf(type) : '';
      // A small body is read whole, and its files are written without the thread pool
      // (SMALL_FILE_BYTES); a larger one streams from its first bytes.
      const content = gzip
        ? await expandedIfSmall(gunzipped(stream()))
        : await wholeIfSmall(SMALL_FILE_BYTES);
      const small = Buffer.isBuffer(content);
      const files: Written[] = [];
      const answer = () => (args.e2b ? e2bEntries(files) : { files });
      if (!form) {
        files.push(await writeOne(safePath(path as string), content, metadata));
        return answer();
      }
      // A small body's parts are read at once; a larger one's as its bytes arrive.
      const parts = small ? wholeFormParts(content, boundary) : readMultipart(content, boundary);
      /** The files written, so that no two parts write one file. */
      const seen = new Set<string>();
      for await (const part of parts) {
        if (part.name !== 'file') continue;
        const asked = path ?? part.filename;
        if (!asked) {
          throw new BadRequestError(
            'a file part has no filename: give ?path= or the full path as the part filename',
          );
        }
        const file = safePath(asked);
        if (seen.has(file)) {
          throw new BadRequestError(
            `cannot upload multiple files to same path ${JSON.stringify(file.slice(0, 200))}: name each part's file by its filename and leave ?path= out`,
            { code: 'EEXIST' },
          );
        }
        seen.add(file);
        const written = await writeOne(file, part.data, metadata);
        files.push(written);
      }
      if (files.length === 0) throw new BadRequestError('the form has no `file` part');
      return answer();
    },
  };
}
