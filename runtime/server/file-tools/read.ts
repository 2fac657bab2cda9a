import { closeSync, readSync, type Stats, statSync } from 'node:fs';
import { resolve } from 'node:path';
import {
  eachLine,
  fsError,
  isUtf8Prefix,
  openForRead,
  type Pace,
  pacer,
  readPrefix,
  readWhole,
} from './fs.js';
import {
  EMPTY_CONTENT_WARNING,
  MAX_BINARY_BYTES,
  MAX_OUTPUT_BYTES,
  type ReadRequest,
  type ToolAnswer,
} from './protocol.js';

/** Past a cut page, files up to this size are counted to the end to report `totalLines`. */
const MAX_COUNT_BYTES = 64 * 1024 * 1024;

async function countLines(file: string, size: number, pace: Pace): Promise<number> {
  const fd = openForRead(file);
  const buf = Buffer.allocUnsafe(1 << 20);
  let lines = 0;
  let last = -1;
  try {
    for (;;) {
      const got = readSync(fd, buf, 0, buf.length, null);
      if (got === 0) break;
      for (let i = buf.indexOf(10, 0); i !== -1 && i < got; i = buf.indexOf(10, i + 1)) lines += 1;
      last = buf[got - 1] as number;
      await pace();
    }
  } finally {
    closeSync(fd);
  }
  return size > 0 && last !== 10 ? lines + 1 : lines;
}

/**
 * A page of a file: lines `offset` (0-based) to `offset + limit`, CRLF as LF, capped near
 * {@link MAX_OUTPUT_BYTES} with a note on how to go on. Media and files whose first 8 KiB are
 * not UTF-8 come whole as base64 (at most {@link MAX_BINARY_BYTES}).
 */
export async function readTool(p: ReadRequest): Promise<ToolAnswer<'read'>> {
  const file = resolve(p.path);
  let st: Stats;
  try {
    st = statSync(file);
  } catch (e) {
    return fsError(e);
  }
  if (st.isDirectory()) return { error: 'is_directory' };
  if (!st.isFile()) return { error: 'not_a_file' };
  if (st.size === 0) return { content: EMPTY_CONTENT_WARNING, encoding: 'utf-8' };
  if (p.media || !isUtf8Prefix(readPrefix(file, 8192))) {
    if (st.size > MAX_BINARY_BYTES) return { error: 'binary_too_large', size: st.size };
    return { content: readWhole(file).toString('base64'), encoding: 'base64' };
  }
  if (p.limit === 0) return { content: '', encoding: 'utf-8', noLinesRequested: true };
  const pace = pacer();
  const parts: string[] = [];
  let bytes = 0;
  let returned = 0;
  let truncated = false;
  const last = p.offset + p.limit;
  const scan = await eachLine(file, pace, (text, n) => {
    if (n <= p.offset) return true;
    if (n > last) return false;
    const piece = returned === 0 ? text : `\n${text}`;
    const size = Buffer.byteLength(piece);
    if (bytes + size > MAX_OUTPUT_BYTES) {
      const room = MAX_OUTPUT_BYTES - bytes;
      if (room > 0) {
        parts.push(
          Buffer.from(piece)
            .subarray(0, room)
            .toString('utf8')
            .replace(/\uFFFD$/, ''),
        );
      }
      truncated = true;
      return false;
    }
    parts.push(piece);
    bytes += size;
    returned += 1;
    return true;
  });
  if (returned === 0 && !truncated) return { error: 'offset_exceeds', lines: scan.lines };
  let totalLines: number | undefined;
  if (!scan.stopped) totalLines = scan.lines;
  else if (st.size <= MAX_COUNT_BYTES) totalLines = await countLines(file, st.size, pace);
  // A line longer than the whole cap still moves the reader on by one line.
  const endLine = p.offset + Math.max(returned, 1);
  let content = parts.join('');
  if (truncated) {
    content += `\n\n[Output was truncated at ${MAX_OUTPUT_BYTES} bytes. Continue reading with offset ${endLine} or a smaller limit.]`;
  }
  return {
    content,
    encoding: 'utf-8',
    totalLines,
    startLine: p.offset + 1,
    endLine,
    nextOffset: totalLines === undefined || endLine < totalLines ? endLine : null,
  };
}
