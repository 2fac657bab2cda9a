import { execFile, execFileSync } from 'node:child_process';
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, WorkspaceRefusedError } from '../../src/index.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { CLI } from '../cli/abx.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { archive } from '../helpers/crafted-tar.js';
import { makeTestCertificates } from '../helpers/test-ca.js';
import { makeRepo } from './fixture.js';

// A remote client's workspace (docs/workspaces.md, "From a remote client"), over TLS: a
// non-admin key uploads a git repository (what .gitignore excludes left out), the sandbox edits
// it, the diff is reviewed, and applyLocal writes the changes into the client's folder (a host
// edit made meanwhile conflicts). Hostile archives are refused at upload, nothing kept.

const run = promisify(execFile);
const isRoot = process.getuid?.() === 0;

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let repo: string;
let apiUrl: string;
let caCert: string;
let adminKey: string;
let aliceKey: string;
const git = (...args: string[]) => execFileSync('git', ['-C', repo, ...args], { encoding: 'utf8' });
const as = (apiKey: string) => ({ apiUrl, apiKey, caCert });

/** Files (not .git, not the ignored secret) and their hashes, as `sha256sum` prints them. */
const TREE =
  "find . -path ./.git -prune -o -type f ! -name secret.env -print | LC_ALL=C sort | xargs -d '\\n' sha256sum";

/** A raw upload of `body` over TLS with `key`. */
async function upload(body: Buffer, key: string) {
  const dispatcher = new Agent({ connect: { ca: readFileSync(caCert, 'utf8') } });
  try {
    const response = await request(`${apiUrl}/v1/workspaces/uploads`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/x-tar' },
      body,
      dispatcher,
    });
    return {
      status: response.statusCode,
      body: (await response.body.json()) as Record<string, string>,
    };
  } finally {
    await dispatcher.close();
  }
}

beforeAll(async () => {
  if (!isRoot) return;
  abx = await createAbxHome();
  const certs = makeTestCertificates(abx.home, ['localhost'], ['127.0.0.1']);
  caCert = certs.caCert;
  const started = await run(
    process.execPath,
    [
      CLI,
      'daemon',
      'start',
      '--listen',
      '127.0.0.1:0',
      '--tls-cert',
      certs.cert,
      '--tls-key',
      certs.key,
      '--json',
    ],
    {
      // A small upload limit, to see it refuse (the repository below is a few kB).
      env: {
        ...process.env,
        ABX_HOME: abx.home,
        ABX_WARM_POOL: '0',
        ABX_WORKSPACE_UPLOAD_MAX_BYTES: String(1024 * 1024),
      },
      timeout: 60_000,
    },
  );
  apiUrl = JSON.parse(started.stdout).remote.apiUrl;
  expect(apiUrl).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  aliceKey = (await ApiKeys.create('ws-remote-alice', as(adminKey))).key;
  repo = makeRepo(
    {
      'README.md': '# demo\n\nline one\nline two\n',
      'old.txt': 'to be deleted\n',
      '.gitignore': 'secret.env\n',
      'secret.env': 'TOKEN=do-not-send\n',
      'src/main.js': 'console.log(1);\n',
    },
    'abx-ws-remote-',
  );
}, 120_000);

afterAll(async () => {
  await abx?.close();
  if (repo) rmSync(repo, { recursive: true, force: true });
}, 60_000);

describe.skipIf(!isRoot)('a remote client uploads its folder over TLS', () => {
  test('gitignore honoured; edits reviewed; applyLocal conflicts on a host edit, then leaves the repo equal to the sandbox', async () => {
    const box = await Sandbox.create({
      ...as(aliceKey),
      workspace: { from: repo, upload: true, gitignore: true },
    });
    try {
      const ws = '/home/user/workspace';
      const listed = await box.commands.run(`ls -A ${ws}`);
      expect(listed.stdout.split('\n').filter(Boolean).sort()).toEqual([
        '.git',
        '.gitignore',
        'README.md',
        'old.txt',
        'src',
      ]);
      await box.commands.run(
        `cd ${ws} && sed -i 's/line two/line 2/' README.md && echo new > new.txt && rm old.txt && chmod +x src/main.js`,
      );
      const names = (await box.workspace.changes()).map((c) => `${c.status} ${c.path}`);
      expect(names).toEqual([
        'modified README.md',
        'added new.txt',
        'deleted old.txt',
        'modified src/main.js',
      ]);
      const patch = await box.workspace.diff();
      writeFileSync(join(abx?.home as string, 'agent.patch'), patch);
      git('apply', '--check', join(abx?.home as string, 'agent.patch'));

      // The daemon's copy is not the client's folder: its apply refuses (forks and snapshots:
      // workspace-upload-fork.test.ts).
      await expect(box.workspace.apply()).rejects.toThrow(/applyLocal/);

      // A host edit made meanwhile: a conflict naming it, nothing written.
      writeFileSync(join(repo, 'README.md'), '# demo\n\nline one\nline two\nhost line\n');
      const refused = await box.workspace.applyLocal().catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(WorkspaceRefusedError);
      expect((refused as WorkspaceRefusedError).refusals.map((r) => r.path)).toEqual(['README.md']);
      expect(existsSync(join(repo, 'new.txt'))).toBe(false);
      expect(existsSync(join(repo, 'old.txt'))).toBe(true);

      const done = await box.workspace.applyLocal({ force: true });
      // Written deletions first, then writes.
      expect(done.applied.map((c) => c.path).sort()).toEqual([
        'README.md',
        'new.txt',
        'old.txt',
        'src/main.js',
      ]);
      expect(done.forced.map((c) => c.path)).toEqual(['README.md']);
      const sandboxTree = await box.commands.run(`cd ${ws} && ${TREE}`);
      const localTree = execFileSync('sh', ['-c', TREE], { cwd: repo, encoding: 'utf8' });
      expect(localTree).toBe(sandboxTree.stdout);
      expect(statSync(join(repo, 'src', 'main.js')).mode & 0o111).not.toBe(0);
      expect(readFileSync(join(repo, 'secret.env'), 'utf8')).toBe('TOKEN=do-not-send\n');
      expect(git('status', '--porcelain').split('\n').filter(Boolean).sort()).toEqual([
        ' D old.txt',
        ' M README.md',
        ' M src/main.js',
        '?? new.txt',
      ]);
    } finally {
      await box.kill();
    }
  }, 120_000);

  test('the CLI: abx create --workspace DIR --upload, abx apply ID --local DIR', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-ws-cli-'));
    const env = {
      ...process.env,
      ABX_API_URL: apiUrl,
      ABX_API_KEY: aliceKey,
      ABX_CA_CERT: caCert,
      NO_COLOR: '1',
    };
    const abxCli = (...args: string[]) =>
      run(process.execPath, [CLI, ...args], { env, timeout: 60_000 });
    let id = '';
    try {
      writeFileSync(join(dir, 'a.txt'), 'one\n');
      // --gitignore reads .gitignore through git: a folder outside a work tree is refused.
      const refused = await abxCli('create', '--workspace', dir, '--upload', '--gitignore').catch(
        (error: { code: number; stderr: string }) => error,
      );
      expect(refused).toMatchObject({
        code: 2,
        stderr: expect.stringMatching(/not in a git work tree/),
      });
      id = (
        await abxCli('create', '-q', '--workspace', `${dir}:/home/user/w`, '--upload')
      ).stdout.trim();
      const box = await Sandbox.connect(id, as(aliceKey));
      await box.commands.run('echo two >> /home/user/w/a.txt');
      const dry = await abxCli('apply', id, '--local', dir, '--dry-run');
      expect(dry.stdout).toContain('would apply modified a.txt');
      expect(readFileSync(join(dir, 'a.txt'), 'utf8')).toBe('one\n');
      await abxCli('apply', id, '--local', dir);
      expect(readFileSync(join(dir, 'a.txt'), 'utf8')).toBe('one\ntwo\n');
    } finally {
      if (id) await Sandbox.kill(id, as(aliceKey));
      rmSync(dir, { recursive: true, force: true });
    }
  }, 90_000);

  test('hostile archives are refused at upload with nothing kept; only the key that uploaded may use an upload', async () => {
    const uploads = join(abx?.home as string, 'workspace-uploads');
    const hostile = [
      { what: 'a link pointing out', entries: [{ name: 'etc', type: '2', link: '/etc' }] },
      { what: 'a climbing link', entries: [{ name: 'a/up', type: '2', link: '../../x' }] },
      {
        what: "a '..' entry",
        entries: [
          { name: 'ok.txt', body: 'x' },
          { name: '../escape.txt', body: 'x' },
        ],
      },
      {
        what: 'a set-uid file',
        entries: [
          { name: 'ok.txt', body: 'x' },
          { name: 'suid', mode: 0o4755, body: 'x' },
        ],
      },
      { what: 'a FIFO', entries: [{ name: 'pipe', type: '6' }] },
    ];
    for (const { what, entries } of hostile) {
      const answer = await upload(archive(entries), aliceKey);
      expect({ what, status: answer.status, code: answer.body.code }).toEqual({
        what,
        status: 400,
        code: 'workspace_archive_refused',
      });
      expect(readdirSync(uploads)).toEqual([]);
    }
    expect(existsSync(join(tmpdir(), 'escape.txt'))).toBe(false);

    // The client refuses what it cannot send, naming it, before the daemon sees anything.
    const fifoDir = mkdtempSync(join(tmpdir(), 'abx-ws-fifo-'));
    try {
      execFileSync('mkfifo', [join(fifoDir, 'pipe')]);
      await expect(
        Sandbox.create({ ...as(aliceKey), workspace: { from: fifoDir, upload: true } }),
      ).rejects.toThrow(/pipe is not a file, folder or symbolic link/);
      expect(readdirSync(uploads)).toEqual([]);
    } finally {
      rmSync(fifoDir, { recursive: true, force: true });
    }

    // Over the daemon's limit (ABX_WORKSPACE_UPLOAD_MAX_BYTES, 1 MiB here): 413, nothing kept.
    const big = await upload(
      archive([{ name: 'big.bin', body: Buffer.alloc(1536 * 1024) }]),
      aliceKey,
    );
    expect(big.status).toBe(413);
    expect(readdirSync(uploads)).toEqual([]);

    const good = await upload(archive([{ name: 'a.txt', body: 'a\n' }]), aliceKey);
    expect(good.status).toBe(200);
    // Another key (the admin's own) cannot take alice's upload: unknown to it.
    await expect(
      Sandbox.create({ ...as(adminKey), workspace: { upload: good.body.uploadId } as never }),
    ).rejects.toMatchObject({ status: 404, code: 'upload_not_found' });
  }, 60_000);
});
