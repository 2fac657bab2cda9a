import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { createDiskImage } from '../../src/providers/local/sandbox-disk.js';

const MiB = 1024 * 1024;
const root = process.getuid?.() === 0;
const dir = mkdtempSync(join(tmpdir(), 'abx-disk-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const sha = (file: string) => createHash('sha256').update(readFileSync(file)).digest('hex');

// Root daemons give each sandbox a disk image; the formatted one lives under /run (root's).
describe.skipIf(!root)('a sandbox disk image (root mode)', () => {
  test('is byte for byte the formatted disk, as sparse as it, and never overwrites', async () => {
    const size = 48 * MiB;
    const first = join(dir, 'first.img');
    const second = join(dir, 'second.img');
    await Promise.all([createDiskImage(first, size), createDiskImage(second, size)]);
    const pristine = `/run/abx-runtime/disk-${size}.img`;
    expect(statSync(first).size).toBe(size);
    expect(sha(first)).toBe(sha(pristine));
    expect(sha(second)).toBe(sha(pristine));
    // Holes stay holes: the copy takes about what the formatted disk takes, not 48 MiB.
    expect(statSync(first).blocks * 512).toBeLessThanOrEqual(statSync(pristine).blocks * 512 + MiB);
    // A file already there (another sandbox's disk) is refused, not reused or truncated.
    await expect(createDiskImage(first, size)).rejects.toMatchObject({ code: 'EEXIST' });
    expect(sha(first)).toBe(sha(pristine));
  });
});
