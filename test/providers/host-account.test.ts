import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { hostAccountIn } from '../../src/providers/local/root-userns.js';

// Whether a root sandbox's root uids are someone's account: read from /etc/passwd once per
// version of the file, and read again when the file changes (an account added later counts).
const dir = mkdtempSync(join(tmpdir(), 'abx-passwd-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test('an account in the range is found, and one added later too', () => {
  const passwd = join(dir, 'passwd');
  writeFileSync(passwd, 'root:x:0:0::/root:/bin/sh\nme:x:1000:1000::/home/me:/bin/sh\n');
  expect(hostAccountIn(2_000_000, 3_000_000, passwd)).toBeUndefined();
  expect(hostAccountIn(1000, 1001, passwd)).toEqual({ name: 'me', uid: 1000 });
  appendFileSync(passwd, 'late:x:2500000:2500000::/home/late:/bin/sh\n');
  expect(hostAccountIn(2_000_000, 3_000_000, passwd)).toEqual({ name: 'late', uid: 2_500_000 });
  // The same range of another file is that file's answer.
  const other = join(dir, 'other');
  writeFileSync(other, 'root:x:0:0::/root:/bin/sh\n');
  expect(hostAccountIn(2_000_000, 3_000_000, other)).toBeUndefined();
  expect(hostAccountIn(2_000_000, 3_000_000, join(dir, 'missing'))).toBeUndefined();
});
