import type { BaseSandbox } from './base-sandbox.js';
import { isHelperError, runHelper } from './helper.js';
import type { ReadOptions, ReadResult } from './types.js';

/** Default `limit` of {@link BaseSandbox.read}. */
export const DEFAULT_READ_LIMIT = 2000;
/** Text of a page is capped near this many bytes. */
export const MAX_OUTPUT_BYTES = 500 * 1024;
/** Binary (base64) content is refused above this many bytes. */
export const MAX_BINARY_BYTES = 500 * 1024;
/** What reading an empty file returns, so a model does not take it for a failed read. */
export const EMPTY_CONTENT_WARNING = 'System reminder: File exists but has empty contents';

/** Extensions read as base64 whatever their bytes: media a multimodal model can take whole. */
const MEDIA_EXTENSIONS = new Set(
  (
    'png jpeg jpg webp gif heic heif bmp tiff ico ' + // images
    'mp4 mpeg mov avi flv mpg webm wmv 3gpp mkv ' + // video
    'wav mp3 aiff aac ogg flac m4a opus ' + // audio
    'pdf ppt pptx'
  ).split(' '),
);

function isMedia(path: string): boolean {
  const name = path.slice(path.lastIndexOf('/') + 1);
  const dot = name.lastIndexOf('.');
  return dot > 0 && MEDIA_EXTENSIONS.has(name.slice(dot + 1).toLowerCase());
}

/** Negative, fractional or non-numeric bounds become whole numbers ≥ 0. */
function bound(value: number | undefined, fallback: number): number {
  const n = value === undefined ? fallback : Number(value);
  if (Number.isNaN(n)) return 0;
  return Math.min(Math.max(0, Math.floor(n)), Number.MAX_SAFE_INTEGER);
}

const READ_PROGRAM = String.raw`
const MAX_OUTPUT_BYTES = ${MAX_OUTPUT_BYTES};
const MAX_BINARY_BYTES = ${MAX_BINARY_BYTES};
const MAX_COUNT_BYTES = 64 * 1024 * 1024;
function countLines(file, size) {
  const fd = fs.openSync(file, 'r');
  const buf = Buffer.alloc(1 << 20);
  let lines = 0;
  let last = -1;
  try {
    for (;;) {
      const got = fs.readSync(fd, buf, 0, buf.length, null);
      if (got === 0) break;
      for (let i = buf.indexOf(10, 0); i !== -1 && i < got; i = buf.indexOf(10, i + 1)) lines += 1;
      last = buf[got - 1];
    }
  } finally {
    fs.closeSync(fd);
  }
  return size > 0 && last !== 10 ? lines + 1 : lines;
}
function main(p) {
  const file = path.resolve(p.path);
  let st;
  try {
    st = fs.statSync(file);
  } catch (e) {
    return fsError(e);
  }
  if (st.isDirectory()) return { error: 'is_directory' };
  if (!st.isFile()) return { error: 'not_a_file' };
  if (st.size === 0) return { content: ${JSON.stringify(EMPTY_CONTENT_WARNING)}, encoding: 'utf-8' };
  if (p.media || !isUtf8Prefix(readPrefix(file, 8192))) {
    if (st.size > MAX_BINARY_BYTES) return { error: 'binary_too_large', size: st.size };
    return { content: fs.readFileSync(file).toString('base64'), encoding: 'base64' };
  }
  if (p.limit === 0) return { content: '', encoding: 'utf-8', noLinesRequested: true };
  const parts = [];
  let bytes = 0;
  let returned = 0;
  let truncated = false;
  const last = p.offset + p.limit;
  const scan = eachLine(file, (text, n) => {
    if (n <= p.offset) return true;
    if (n > last) return false;
    const piece = returned === 0 ? text : '\n' + text;
    const size = Buffer.byteLength(piece);
    if (bytes + size > MAX_OUTPUT_BYTES) {
      const room = MAX_OUTPUT_BYTES - bytes;
      if (room > 0) parts.push(Buffer.from(piece).subarray(0, room).toString('utf8').replace(/\uFFFD$/, ''));
      truncated = true;
      return false;
    }
    parts.push(piece);
    bytes += size;
    returned += 1;
    return true;
  });
  if (returned === 0 && !truncated) return { error: 'offset_exceeds', lines: scan.lines };
  let totalLines;
  if (!scan.stopped) totalLines = scan.lines;
  else if (st.size <= MAX_COUNT_BYTES) totalLines = countLines(file, st.size);
  // A line longer than the whole cap still moves the reader on by one line.
  const endLine = p.offset + Math.max(returned, 1);
  let content = parts.join('');
  if (truncated) {
    content += '\n\n[Output was truncated at ' + MAX_OUTPUT_BYTES + ' bytes. Continue reading with offset ' + endLine + ' or a smaller limit.]';
  }
  return {
    content: content,
    encoding: 'utf-8',
    totalLines: totalLines,
    startLine: p.offset + 1,
    endLine: endLine,
    nextOffset: totalLines === undefined || endLine < totalLines ? endLine : null,
  };
}
`;

interface ReadAnswer {
  content: string;
  encoding: 'utf-8' | 'base64';
  totalLines?: number;
  startLine?: number;
  endLine?: number;
  nextOffset?: number | null;
  noLinesRequested?: boolean;
}

function readError(path: string, offset: number, answer: Record<string, unknown>): string {
  switch (answer.error) {
    case 'file_not_found':
      return `File '${path}' not found`;
    case 'is_directory':
      return `'${path}' is a directory, not a file (list it with ls)`;
    case 'not_a_file':
      return `'${path}' is not a regular file`;
    case 'permission_denied':
      return `Permission denied reading '${path}'`;
    case 'binary_too_large':
      return `File '${path}' is binary (${answer.size} bytes) and exceeds the maximum preview size of ${MAX_BINARY_BYTES} bytes`;
    case 'offset_exceeds':
      return `Line offset ${offset} exceeds file length (${answer.lines} lines)`;
    default:
      return `Error reading '${path}': ${answer.detail ?? answer.error}`;
  }
}

/** {@link BaseSandbox.read}: pages the file on the sandbox side. */
export async function readFile(
  sandbox: BaseSandbox,
  path: string,
  options: ReadOptions = {},
): Promise<ReadResult> {
  const offset = bound(options.offset, 0);
  const limit = bound(options.limit, DEFAULT_READ_LIMIT);
  const outcome = await runHelper<ReadAnswer | Record<string, unknown>>(sandbox, READ_PROGRAM, {
    path,
    offset,
    limit,
    media: isMedia(path),
  });
  if (!outcome.ok) return { error: outcome.error };
  const answer = outcome.value;
  if (isHelperError(answer)) return { error: readError(path, offset, answer) };
  const page = answer as ReadAnswer;
  const result: ReadResult = { fileData: { content: page.content, encoding: page.encoding } };
  if (page.noLinesRequested) result.noLinesRequested = true;
  if (page.startLine !== undefined) {
    if (page.totalLines !== undefined) result.totalLines = page.totalLines;
    result.startLine = page.startLine;
    result.endLine = page.endLine;
    result.nextOffset = page.nextOffset ?? null;
  }
  return result;
}
