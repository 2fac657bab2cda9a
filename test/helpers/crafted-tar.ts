/**
 * Tar archives built byte by byte, as an attacker would: any type flag, mode, owner, name, link
 * target or declared size, bodies shorter than declared, broken checksums. Independent of the
 * writer under test (runtime/envd/tar-format.ts), so neither can hide the other's mistakes.
 */

export interface Crafted {
  name: string | Buffer;
  /** The type flag: '0' file, '1' hard link, '2' symlink, '3' char device, '4' block device, '5' dir, '6' FIFO, 'x' pax... */
  type?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  /** Declared body size; defaults to the body's length. */
  size?: number;
  body?: string | Buffer;
  link?: string;
  devmajor?: number;
  devminor?: number;
  /** Break the header's checksum. */
  badChecksum?: boolean;
}

function octal(block: Buffer, offset: number, width: number, value: number): void {
  block.write(`${value.toString(8).padStart(width - 1, '0')}\0`, offset, width, 'ascii');
}

export function header(entry: Crafted): Buffer {
  const block = Buffer.alloc(512);
  const name = Buffer.isBuffer(entry.name) ? entry.name : Buffer.from(entry.name);
  name.copy(block, 0, 0, Math.min(100, name.length));
  const body = entry.body === undefined ? Buffer.alloc(0) : Buffer.from(entry.body);
  octal(block, 100, 8, entry.mode ?? 0o644);
  octal(block, 108, 8, entry.uid ?? 0);
  octal(block, 116, 8, entry.gid ?? 0);
  octal(block, 124, 12, entry.size ?? body.length);
  octal(block, 136, 12, 1_700_000_000);
  block.write(entry.type ?? '0', 156, 1, 'ascii');
  if (entry.link) block.write(entry.link, 157, 100);
  block.write('ustar\u000000', 257, 8, 'ascii');
  block.write('root', 265, 32);
  block.write('root', 297, 32);
  octal(block, 329, 8, entry.devmajor ?? 0);
  octal(block, 337, 8, entry.devminor ?? 0);
  block.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of block) sum += byte;
  if (entry.badChecksum) sum += 1;
  block.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'ascii');
  return block;
}

/** Header, body and padding; a body shorter than `size` is sent as is (a truncated entry). */
export function entry(e: Crafted): Buffer {
  const body = e.body === undefined ? Buffer.alloc(0) : Buffer.from(e.body);
  const padding = Buffer.alloc((512 - (body.length % 512)) % 512);
  return Buffer.concat([header(e), body, padding]);
}

/** A pax extended header ('x') whose records apply to the next entry. */
export function pax(records: Record<string, string>): Crafted {
  let body = '';
  for (const [key, value] of Object.entries(records)) {
    const text = ` ${key}=${value}\n`;
    let length = Buffer.byteLength(text);
    while (String(length).length + Buffer.byteLength(text) !== length) {
      length = String(length).length + Buffer.byteLength(text);
    }
    body += `${length}${text}`;
  }
  return { name: 'PaxHeader', type: 'x', body };
}

export const END = Buffer.alloc(1024);

/** The entries one after the other, and the two zero blocks that end an archive unless `end: false`. */
export function archive(entries: Crafted[], options: { end?: boolean } = {}): Buffer {
  return Buffer.concat([...entries.map(entry), ...(options.end === false ? [] : [END])]);
}
