import { closeSync, mkdirSync, openSync, readSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import {
  CAPTURE_META_MARK,
  PREVIEW_HEAD_BYTES,
  PREVIEW_HEAD_LINES,
  PREVIEW_TAIL_BYTES,
  PREVIEW_TAIL_LINES,
} from './protocol.js';

/**
 * Filters a command's combined output, piped to its stdin; arguments: capture file, inline
 * limit, capture limit (bytes). Up to `inline` bytes are held in memory and printed whole (no
 * file is ever created); past that, everything goes to the capture file and only a head/tail
 * preview is printed. Past `max` bytes it keeps reading and discarding, so the command never gets
 * SIGPIPE and exits with its own code. The first line printed is the meta line (protocol.ts).
 */
const file = process.argv[1] as string;
const inline = Number(process.argv[2]);
const max = Number(process.argv[3]);
let held: Buffer[] = [];
let heldBytes = 0;
let fd: number | null = null;
let kept = 0;
let capped = false;
let newlines = 0;
let lastByte = -1;

function writeAll(out: number, buf: Buffer): void {
  let at = 0;
  while (at < buf.length) at += writeSync(out, buf, at, buf.length - at);
}

function slice(start: number, length: number): string {
  const buf = Buffer.alloc(length);
  const rfd = openSync(file, 'r');
  try {
    return buf.subarray(0, readSync(rfd, buf, 0, length, start)).toString('utf8');
  } finally {
    closeSync(rfd);
  }
}

process.stdin.on('data', (chunk: Buffer) => {
  if (kept >= max) {
    capped = true;
    return;
  }
  let piece = chunk;
  if (kept + piece.length > max) {
    piece = piece.subarray(0, max - kept);
    capped = true;
  }
  kept += piece.length;
  for (let i = piece.indexOf(10); i !== -1; i = piece.indexOf(10, i + 1)) newlines += 1;
  if (piece.length > 0) lastByte = piece[piece.length - 1] as number;
  if (fd !== null) return writeAll(fd, piece);
  held.push(piece);
  heldBytes += piece.length;
  if (heldBytes > inline) {
    mkdirSync(dirname(file), { recursive: true });
    fd = openSync(file, 'w');
    writeAll(fd, Buffer.concat(held));
    held = [];
  }
});

process.stdin.on('end', () => {
  if (fd === null) {
    process.stdout.write(`${CAPTURE_META_MARK} 0 ${capped ? 1 : 0}\n`);
    process.stdout.write(Buffer.concat(held));
    return;
  }
  closeSync(fd);
  const lines = newlines + (lastByte !== 10 && kept > 0 ? 1 : 0);
  const head = slice(0, Math.min(PREVIEW_HEAD_BYTES, kept))
    .split('\n')
    .slice(0, PREVIEW_HEAD_LINES);
  let tail = slice(
    Math.max(0, kept - PREVIEW_TAIL_BYTES),
    Math.min(PREVIEW_TAIL_BYTES, kept),
  ).split('\n');
  if (tail[tail.length - 1] === '') tail.pop();
  tail = tail.slice(-PREVIEW_TAIL_LINES);
  const omitted = lines - head.length - tail.length;
  const preview =
    omitted > 0
      ? `${head.join('\n')}\n... [${omitted} lines omitted] ...\n${tail.join('\n')}`
      : slice(0, Math.min(PREVIEW_HEAD_BYTES + PREVIEW_TAIL_BYTES, kept));
  process.stdout.write(`${CAPTURE_META_MARK} 1 ${capped ? 1 : 0}\n${preview}`);
});
