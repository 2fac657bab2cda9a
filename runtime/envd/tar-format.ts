/** The unit of a tar archive: headers are one block, bodies are padded to whole blocks. */
export const BLOCK = 512;

/** Two zero blocks end an archive. */
export const END_OF_ARCHIVE = Buffer.alloc(2 * BLOCK);

/** The kinds of entry envd writes: `0` file, `2` symbolic link, `5` directory. */
export type TarType = '0' | '2' | '5';

export interface TarEntry {
  /** Raw bytes of the path inside the archive (`/`-separated; a directory ends with `/`). */
  name: Buffer;
  type: TarType;
  mode: number;
  uid: number;
  gid: number;
  /** Bytes of the body: a file's size, 0 for the others. */
  size: number;
  /** Seconds since the epoch. */
  mtime: number;
  /** Target of a symbolic link, raw bytes. */
  link?: Buffer;
}

/** Zero bytes that pad a body of `size` bytes to a whole block. */
export function padding(size: number): Buffer {
  return Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK);
}

/**
 * A number in a header field of `width` bytes: octal digits and a NUL when they fit, else GNU's
 * base-256 form (high bit set, big-endian), which GNU tar and node-tar read. Negative
 * values (an mtime before 1970) are written as 0.
 */
function writeNumber(block: Buffer, offset: number, width: number, value: number): void {
  const n = Math.max(0, Math.floor(value));
  const octal = n.toString(8);
  if (octal.length < width) {
    block.write(`${octal.padStart(width - 1, '0')}\0`, offset, width, 'ascii');
    return;
  }
  let rest = BigInt(n);
  for (let i = offset + width - 1; i > offset; i--) {
    block[i] = Number(rest & 0xffn);
    rest >>= 8n;
  }
  block[offset] = 0x80;
}

/** One ustar header block; names and targets longer than their fields are cut (see below). */
function ustarBlock(entry: TarEntry, type: string, size: number): Buffer {
  const block = Buffer.alloc(BLOCK);
  entry.name.copy(block, 0, 0, Math.min(entry.name.length, 100));
  writeNumber(block, 100, 8, entry.mode & 0o7777);
  writeNumber(block, 108, 8, entry.uid);
  writeNumber(block, 116, 8, entry.gid);
  writeNumber(block, 124, 12, size);
  writeNumber(block, 136, 12, entry.mtime);
  block.write(type, 156, 1, 'ascii');
  entry.link?.copy(block, 157, 0, Math.min(entry.link.length, 100));
  block.write('ustar\u000000', 257, 8, 'ascii');
  // The checksum is taken with its own field read as eight spaces.
  block.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of block) sum += byte;
  block.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'ascii');
  return block;
}

/** A GNU long-name (`L`) or long-link (`K`) record: the whole value as the body of an entry. */
function longRecord(entry: TarEntry, type: 'L' | 'K', value: Buffer): Buffer[] {
  const body = Buffer.concat([value, Buffer.alloc(1)]);
  const meta: TarEntry = { ...entry, name: Buffer.from('././@LongLink'), link: undefined };
  return [ustarBlock(meta, type, body.length), body, padding(body.length)];
}

/**
 * The header of an entry. A name or link target over 100 bytes goes first in a GNU `L`/`K`
 * record rather than a pax `path`: readers take those bytes whole, while pax records are
 * newline-terminated and node-tar drops a path that holds a newline.
 */
export function entryHeader(entry: TarEntry): Buffer {
  const parts: Buffer[] = [];
  if (entry.name.length > 100) parts.push(...longRecord(entry, 'L', entry.name));
  if (entry.link && entry.link.length > 100) parts.push(...longRecord(entry, 'K', entry.link));
  parts.push(ustarBlock(entry, entry.type, entry.size));
  return Buffer.concat(parts);
}

/** Bytes an entry takes in the archive: header records, body and its padding. */
export function entryBytes(entry: TarEntry): number {
  const long = (value: Buffer | undefined) =>
    value && value.length > 100 ? BLOCK + Math.ceil((value.length + 1) / BLOCK) * BLOCK : 0;
  return BLOCK + long(entry.name) + long(entry.link) + Math.ceil(entry.size / BLOCK) * BLOCK;
}
