import { BadRequestError, UpstreamError } from '../errors.js';

/**
 * The HTTP/1.1 framing the gateway needs to route whole connections: where each request and
 * response head ends, and how long the body after it is. Heads are parsed whole (they are small);
 * bodies are only counted, never copied. Strict where a lenient reading could differ from the
 * peer's (RFC 9112: bare CR or LF, space before a colon, folded lines, both Content-Length and
 * Transfer-Encoding, duplicate lengths), so the gateway never disagrees with the sandbox or the
 * client about where a message ends.
 */

/** A head larger than node's default `maxHeaderSize` is refused, as node's parser would (431). */
export const MAX_HEAD_BYTES = 16 * 1024;
/** Responses come from code in the sandbox; their heads may be larger, within reason. */
export const MAX_RESPONSE_HEAD_BYTES = 64 * 1024;

export const END_OF_HEAD = Buffer.from('\r\n\r\n');

/** One request head, as the gateway reads and rewrites it. */
export interface RequestHead {
  method: string;
  /** The request target as sent: `..` and `%2e%2e` stay for the sandbox's router to judge. */
  target: string;
  /** `HTTP/1.0` or `HTTP/1.1`. */
  version: string;
  /** Header names as sent, values without surrounding whitespace, in order. */
  names: string[];
  values: string[];
  /** Lower-case names, index for index. */
  keys: string[];
  host: string | undefined;
  /** `X-Sandbox-Id`, `X-Sandbox-Port`, `X-Access-Token` (repeated ones joined, as node does). */
  sandboxId: string | undefined;
  sandboxPort: string | undefined;
  accessToken: string | undefined;
  /** The body's length, or -1 for a chunked body. */
  bodyLength: number;
  /** A protocol switch (`Connection: upgrade` with `Upgrade`): bytes after the head are not HTTP. */
  upgrade: boolean;
  /** The client closes the connection after this exchange (`Connection: close`, or HTTP/1.0). */
  close: boolean;
}

/** How a response's body is delimited. */
export type ResponseBody =
  | { kind: 'none' }
  | { kind: 'length'; length: number }
  | { kind: 'chunked' }
  /** Until the sandbox closes the connection. */
  | { kind: 'close' };

export interface ResponseHead {
  status: number;
  body: ResponseBody;
  /** The sandbox closes the connection after this response. */
  close: boolean;
}

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Control characters (a lone CR or LF among them); HTAB is allowed in values. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: finding them is the point
const CONTROL = /[\x00-\x08\x0a-\x1f\x7f]/;
const DIGITS = /^\d{1,15}$/;
const HEX = /^[0-9a-fA-F]{1,12}$/;

/** The gateway's answer to a request it cannot read: a 400 (or `status`) of the contract's shape. */
export function badRequest(
  message: string,
  options: { status?: number; code?: string } = {},
): BadRequestError {
  return new BadRequestError(`the request could not be read: ${message}`, options);
}

/** A value without the spaces and tabs around it (not `trim()`: that also drops U+00A0). */
function withoutOws(text: string, from: number): string {
  let start = from;
  let end = text.length;
  while (start < end && (text.charCodeAt(start) === 32 || text.charCodeAt(start) === 9)) start++;
  while (end > start && (text.charCodeAt(end - 1) === 32 || text.charCodeAt(end - 1) === 9)) end--;
  return text.slice(start, end);
}

/** The comma-separated tokens of a header value, lower-cased. */
function tokensOf(value: string): string[] {
  return value.split(',').map((item) => withoutOws(item, 0).toLowerCase());
}

interface HeaderLines {
  names: string[];
  values: string[];
  keys: string[];
}

/** Splits header lines (`lines[1..]`) into names and values, refusing anything malformed. */
function headerLines(lines: string[], fail: (message: string) => Error): HeaderLines {
  const names: string[] = [];
  const values: string[] = [];
  const keys: string[] = [];
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i] as string;
    if (CONTROL.test(line)) throw fail('a header holds a control character or a bare CR or LF');
    const colon = line.indexOf(':');
    const name = colon > 0 ? line.slice(0, colon) : '';
    // Also refuses `Name : value` and folded lines (starting with a space), which RFC 9112 forbids.
    if (!TOKEN.test(name)) throw fail('a header line is not `name: value`');
    names.push(name);
    values.push(withoutOws(line, colon + 1));
    keys.push(name.toLowerCase());
  }
  return { names, values, keys };
}

/** Parses a request head (the text before its blank line). Throws a 4xx {@link BadRequestError}. */
export function parseRequestHead(text: string): RequestHead {
  const lines = text.split('\r\n');
  const requestLine = lines[0] as string;
  if (CONTROL.test(requestLine)) {
    throw badRequest('the request line holds a control character or a bare CR or LF');
  }
  const parts = requestLine.split(' ');
  const [method, target, version] = parts as [string, string, string];
  if (parts.length !== 3 || !TOKEN.test(method) || target === '') {
    throw badRequest('the request line is not `METHOD /path HTTP/1.1`');
  }
  if (version !== 'HTTP/1.1' && version !== 'HTTP/1.0') {
    throw badRequest(`${version.slice(0, 20)} is not HTTP/1.1 or HTTP/1.0`);
  }
  // Origin form only: the gateway is no forward proxy, and a sandbox's router reads paths.
  if (!target.startsWith('/') && !(target === '*' && method === 'OPTIONS')) {
    throw badRequest('the request target is not a path');
  }
  if (method === 'CONNECT') throw badRequest('CONNECT is not supported by the gateway');
  const { names, values, keys } = headerLines(lines, badRequest);
  const head: RequestHead = {
    method,
    target,
    version,
    names,
    values,
    keys,
    host: undefined,
    sandboxId: undefined,
    sandboxPort: undefined,
    accessToken: undefined,
    bodyLength: 0,
    upgrade: false,
    close: version === 'HTTP/1.0',
  };
  const join = (before: string | undefined, value: string) =>
    before === undefined ? value : `${before}, ${value}`;
  let length: string | undefined;
  let encoding: string | undefined;
  let connection: string[] = [];
  let upgrade = false;
  for (let i = 0; i < keys.length; i++) {
    const value = values[i] as string;
    switch (keys[i]) {
      case 'host':
        if (head.host !== undefined) throw badRequest('more than one Host header');
        head.host = value;
        break;
      case 'x-sandbox-id':
        head.sandboxId = join(head.sandboxId, value);
        break;
      case 'x-sandbox-port':
        head.sandboxPort = join(head.sandboxPort, value);
        break;
      case 'x-access-token':
        head.accessToken = join(head.accessToken, value);
        break;
      case 'content-length':
        if (length !== undefined) throw badRequest('more than one Content-Length header');
        length = value;
        break;
      case 'transfer-encoding':
        if (encoding !== undefined) throw badRequest('more than one Transfer-Encoding header');
        encoding = value;
        break;
      case 'connection':
        connection = connection.concat(tokensOf(value));
        break;
      case 'upgrade':
        upgrade = true;
        break;
    }
  }
  if (encoding !== undefined) {
    if (length !== undefined) throw badRequest('both Content-Length and Transfer-Encoding');
    if (encoding.toLowerCase() !== 'chunked' || version === 'HTTP/1.0') {
      throw badRequest(`Transfer-Encoding ${encoding.slice(0, 40)} is not supported (chunked is)`);
    }
    head.bodyLength = -1;
  } else if (length !== undefined) {
    if (!DIGITS.test(length)) throw badRequest('Content-Length is not a number');
    head.bodyLength = Number(length);
  }
  if (connection.includes('close')) head.close = true;
  else if (connection.includes('keep-alive')) head.close = false;
  head.upgrade = upgrade && connection.includes('upgrade');
  if (head.upgrade && head.bodyLength !== 0) {
    throw badRequest('a protocol upgrade with a body');
  }
  return head;
}

function badResponse(message: string): UpstreamError {
  return new UpstreamError(`the sandbox answered something that is not HTTP/1.1: ${message}`);
}

/**
 * Parses a response head from the sandbox. `method` is the request's (a HEAD response has no
 * body). Throws an {@link UpstreamError}.
 */
export function parseResponseHead(text: string, method: string): ResponseHead {
  const lines = text.split('\r\n');
  const statusLine = lines[0] as string;
  const match = /^HTTP\/1\.([01]) (\d{3})(?: |$)/.exec(statusLine);
  if (!match || CONTROL.test(statusLine)) throw badResponse('a bad status line');
  const status = Number(match[2]);
  const { keys, values } = headerLines(lines, badResponse);
  let length: string | undefined;
  let encoding: string[] | undefined;
  let connection: string[] = [];
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i];
    if (key === 'content-length') {
      if (length !== undefined) throw badResponse('more than one Content-Length');
      length = values[i] as string;
    } else if (key === 'transfer-encoding') {
      encoding = (encoding ?? []).concat(tokensOf(values[i] as string));
    } else if (key === 'connection') {
      connection = connection.concat(tokensOf(values[i] as string));
    }
  }
  const close =
    connection.includes('close') || (match[1] === '0' && !connection.includes('keep-alive'));
  if (status < 200 || status === 204 || status === 304 || method === 'HEAD') {
    return { status, body: { kind: 'none' }, close };
  }
  if (encoding !== undefined) {
    if (length !== undefined) throw badResponse('both Content-Length and Transfer-Encoding');
    return { status, body: { kind: encoding.at(-1) === 'chunked' ? 'chunked' : 'close' }, close };
  }
  if (length !== undefined) {
    if (!DIGITS.test(length)) throw badResponse('Content-Length is not a number');
    return { status, body: { kind: 'length', length: Number(length) }, close };
  }
  return { status, body: { kind: 'close' }, close: true };
}

const CR = 13;
const LF = 10;
/** A chunk-size line with its extensions, or one trailer line, may not be longer than this. */
const MAX_CHUNK_LINE = 4096;

/**
 * Follows a chunked body (RFC 9112 §7.1) across reads without copying it: chunk sizes, the CRLF
 * after each chunk, the trailer section. {@link feed} says where the body ends.
 */
export class ChunkedScanner {
  /** 'size': reading a chunk-size line; 'data': inside a chunk; 'crlf': after one; 'trailer'. */
  private state: 'size' | 'data' | 'crlf' | 'trailer' = 'size';
  private line = '';
  private left = 0;
  private trailerBytes = 0;

  constructor(private readonly fail: (message: string) => Error) {}

  /**
   * Consumes `buf[start, end)`. Returns where the body ended (the index after its last byte) when
   * it did, or -1 when all of it belongs to the body. Throws on a malformed body. `onData` gets each
   * range of chunk data (the body without its framing), for a reader that hands the body on.
   */
  feed(
    buf: Buffer,
    start: number,
    end: number,
    onData?: (from: number, to: number) => void,
  ): number {
    let pos = start;
    while (pos < end) {
      if (this.state === 'data') {
        const take = Math.min(this.left, end - pos);
        if (take > 0) onData?.(pos, pos + take);
        pos += take;
        this.left -= take;
        if (this.left === 0) {
          this.state = 'crlf';
          this.line = '';
        }
        continue;
      }
      // A line: the chunk size, the CRLF after a chunk's data, or a trailer line.
      const lf = buf.indexOf(LF, pos);
      const stop = lf < 0 || lf >= end ? end : lf + 1;
      this.line += buf.toString('latin1', pos, stop);
      pos = stop;
      if (this.line.length > MAX_CHUNK_LINE) throw this.fail('a chunk line is too long');
      if (stop === end && buf[stop - 1] !== LF) continue;
      const line = this.line;
      this.line = '';
      if (line.length < 2 || line.charCodeAt(line.length - 2) !== CR) {
        throw this.fail('a chunk line does not end with CRLF');
      }
      const text = line.slice(0, -2);
      if (this.state === 'crlf') {
        if (text !== '') throw this.fail('a chunk is longer than its size');
        this.state = 'size';
      } else if (this.state === 'size') {
        const semicolon = text.indexOf(';');
        const size = withoutOws(semicolon < 0 ? text : text.slice(0, semicolon), 0);
        if (!HEX.test(size) || CONTROL.test(text) || /^[ \t]/.test(text)) {
          throw this.fail('a bad chunk size');
        }
        this.left = Number.parseInt(size, 16);
        this.state = this.left === 0 ? 'trailer' : 'data';
      } else {
        // Trailer section: lines until an empty one.
        this.trailerBytes += line.length;
        if (this.trailerBytes > MAX_HEAD_BYTES) throw this.fail('the trailer section is too long');
        if (text === '') return pos;
        if (CONTROL.test(text) || !TOKEN.test(text.slice(0, Math.max(0, text.indexOf(':'))))) {
          throw this.fail('a bad trailer line');
        }
      }
    }
    return -1;
  }
}

/** A chunked scanner for a request body (4xx on a malformed one). */
export const requestChunks = () => new ChunkedScanner((message) => badRequest(message));
/** A chunked scanner for a response body (502 on a malformed one). */
export const responseChunks = () => new ChunkedScanner((message) => badResponse(message));
