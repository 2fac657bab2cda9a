import { deflateSync } from 'node:zlib';

/** Git's base85 alphabet (base85.c). */
const EN85 =
  '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~';

/** Git's encode_85: groups of 4 bytes (the last zero-padded) as 5 characters. */
export function encode85(data: Buffer): string {
  let out = '';
  for (let i = 0; i < data.length; i += 4) {
    let acc = 0;
    for (let j = 0; j < 4; j++) acc = acc * 256 + (i + j < data.length ? data[i + j] : 0);
    const group = new Array<string>(5);
    for (let k = 4; k >= 0; k--) {
      group[k] = EN85[acc % 85];
      acc = Math.floor(acc / 85);
    }
    out += group.join('');
  }
  return out;
}

/**
 * One `literal` hunk of a `GIT binary patch`: the data deflated (zlib, level 1 as git's
 * core.compression default for this) in lines of at most 52 bytes, each led by its length
 * (`A`–`Z` for 1–26, `a`–`z` for 27–52), then an empty line.
 */
export function binaryLiteral(data: Buffer): string {
  const deflated = deflateSync(data, { level: 1 });
  let out = `literal ${data.length}\n`;
  for (let i = 0; i < deflated.length; i += 52) {
    const line = deflated.subarray(i, i + 52);
    const n = line.length;
    out += `${n <= 26 ? String.fromCharCode(64 + n) : String.fromCharCode(96 + n - 26)}${encode85(line)}\n`;
  }
  return `${out}\n`;
}

/**
 * Git's default hunk-header function name (xdiff's def_ff): the nearest line above the hunk
 * that starts with a letter, `_` or `$`, cut to 80 bytes, trailing white space removed.
 */
export function funcLine(line: string): string | undefined {
  if (!/^[A-Za-z_$]/.test(line)) return undefined;
  return line.slice(0, 80).replace(/[ \t\n\v\f\r]+$/, '');
}
