import { openSync, readSync } from 'node:fs';

// Random names and the token check without node:crypto. Loading node:crypto starts OpenSSL: 1.3
// MiB of private memory in every process that does (Node 24, measured; bench/README.md "envd's
// memory"), and envd, in every sandbox, needs nothing of it but random bytes and an equality
// check that takes the same time whatever the bytes compared (issue 50). Here, beside the file
// tools, because they ride in BaseSandbox's programs too (edit's temporary names), which may
// import only node: built-ins and this folder, and run on the sandbox's own Node (14.14 and up).

/** The kernel's random source; every provider's sandbox has one (bwrap's --dev, Docker's, a pod's). */
const URANDOM = '/dev/urandom';
/**
 * Opened once and kept (close-on-exec, as Node opens every file): a file written through envd
 * takes a random temporary name, and three system calls a name would be two too many.
 */
let urandom: number | undefined;

/**
 * `count` random bytes from the kernel's source, read whole (never short: /dev/urandom does not
 * block and returns what was asked up to 32 MiB). Where /dev/urandom cannot be opened (an image
 * that lacks it), Web Crypto's `getRandomValues`, which loads node:crypto.
 */
export function randomBytes(count: number): Buffer {
  const bytes = Buffer.alloc(count);
  try {
    urandom ??= openSync(URANDOM, 'r');
  } catch {
    globalThis.crypto.getRandomValues(bytes);
    return bytes;
  }
  for (let read = 0; read < count; ) {
    const got = readSync(urandom, bytes, read, count - read, null);
    if (got === 0) throw new Error(`${URANDOM} ended after ${read} of ${count} bytes`);
    read += got;
  }
  return bytes;
}

/** A random (version 4) UUID, as node:crypto's `randomUUID`. */
export function randomUUID(): string {
  const bytes = randomBytes(16);
  bytes[6] = ((bytes[6] as number) & 0x0f) | 0x40;
  bytes[8] = ((bytes[8] as number) & 0x3f) | 0x80;
  const hex = bytes.toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/**
 * Whether `given` equals the secret `expected`, in a time that depends on `expected`'s length
 * only: every byte of `expected` is compared, whatever `given` holds or how long it is (as Go's
 * `subtle.ConstantTimeCompare`; node:crypto's `timingSafeEqual` needs equal lengths, which the
 * server got by hashing both). The secret's length is all the time can say, and tokens have a
 * fixed length.
 */
export function sameSecret(given: Buffer, expected: Buffer): boolean {
  let difference = given.length ^ expected.length;
  for (let at = 0; at < expected.length; at++) {
    difference |= (expected[at] as number) ^ (at < given.length ? (given[at] as number) : 0);
  }
  return difference === 0;
}
