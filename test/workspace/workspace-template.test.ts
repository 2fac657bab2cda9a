import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox as E2bSandbox } from 'e2b';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { TemplateError } from '../../src/commands/errors.js';
import { parseTemplate } from '../../src/commands/template.js';
import { type DaemonInfo, Sandbox, Template, Templates } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';

// A workspace from a template (`workspace:` in template.yaml, `Template.setWorkspace`) and from
// E2B's face (a template's, or metadata `abx.workspace` on E2B's unmodified SDK's create):
// mounted as a create's own, checked for the key that creates, a create's own replacing it.

const isRoot = process.getuid?.() === 0;
const yaml = (workspace: string) => `name: ws\nworkspace: ${workspace}\n`;

describe('template.yaml workspace:', () => {
  test('is read as { from, path? }; bad values are refused naming the key', () => {
    expect(parseTemplate(yaml('{ from: /srv/repo, path: /home/user/repo }')).workspace).toEqual({
      from: '/srv/repo',
      path: '/home/user/repo',
    });
    expect(parseTemplate(yaml('{ from: /srv/repo }')).workspace).toEqual({ from: '/srv/repo' });
    expect(parseTemplate('name: ws\n').workspace).toBeUndefined();
    const refused = (text: string) => {
      try {
        parseTemplate(text);
      } catch (error) {
        expect(error).toBeInstanceOf(TemplateError);
        return (error as Error).message;
      }
      throw new Error(`accepted: ${text}`);
    };
    expect(refused(yaml('{ from: ./repo }'))).toMatch(/workspace\.from: must be an absolute path/);
    expect(refused(yaml('{ from: /srv/repo, path: repo }'))).toMatch(
      /workspace\.path: must be an absolute path/,
    );
    expect(refused(yaml('{ from: /srv/repo, mode: ro }'))).toMatch(/workspace\.mode: unknown key/);
    expect(refused(yaml('{ path: /home/user/repo }'))).toMatch(/workspace: missing `from:`/);
    expect(refused(yaml('/srv/repo'))).toMatch(/workspace: must be a mapping/);
    // The builder writes the same key.
    expect(
      parseTemplate(Template.fromBase().setWorkspace('/srv/repo', '/home/user/r').toYaml('ws'))
        .workspace,
    ).toEqual({ from: '/srv/repo', path: '/home/user/r' });
  });
});

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let info: DaemonInfo;
let adminKey: string;
let repo: string;
let other: string;
const name = `ws-tpl-${Date.now().toString(36)}`;

beforeAll(async () => {
  if (!isRoot) return;
  process.env.ABX_WARM_POOL = '0';
  abx = await createAbxHome();
  home = abx.home;
  repo = mkdtempSync(join(tmpdir(), 'abx-ws-tpl-'));
  other = mkdtempSync(join(tmpdir(), 'abx-ws-other-'));
  writeFileSync(join(repo, 'README.md'), 'from the template\n');
  writeFileSync(join(other, 'OTHER.md'), 'from the create\n');
  info = await startDaemon(home);
  adminKey = readFileSync(join(home, 'api-key'), 'utf8').trim();
  // The daemon's own key builds it: shared with every key (published).
  await Templates.build(Template.fromBase().setWorkspace(repo, '/home/user/repo'), {
    home,
    name,
  });
}, 120_000);

afterAll(async () => {
  delete process.env.ABX_WARM_POOL;
  if (abx) await removeTemplates(home).catch(() => undefined);
  await abx?.close();
  for (const dir of [repo, other]) if (dir) rmSync(dir, { recursive: true, force: true });
}, 60_000);

async function changes(id: string): Promise<string[]> {
  const response = await request(`${info.apiUrl}/v1/sandboxes/${id}/workspace/changes`, {
    headers: { authorization: `Bearer ${adminKey}` },
  });
  const body = (await response.body.json()) as { entries: { status: string; path: string }[] };
  expect(response.statusCode).toBe(200);
  return body.entries.map((c) => `${c.status} ${c.path}`);
}

describe.skipIf(!isRoot)('a workspace from a template and from E2B (root daemon)', () => {
  test("a create from the template mounts its folder; a create's own workspace replaces it; another key is refused for itself", async () => {
    const box = await Sandbox.create({ home, template: name });
    try {
      const run = async (cmd: string) => (await box.commands.run(cmd)).stdout;
      expect(await run('cat ~/repo/README.md && echo agent > ~/repo/new.txt')).toBe(
        'from the template\n',
      );
      expect(await changes(box.sandboxId)).toEqual(['added new.txt']);
      expect(readFileSync(join(repo, 'README.md'), 'utf8')).toBe('from the template\n');
    } finally {
      await box.kill();
    }

    const own = await Sandbox.create({ home, template: name, workspace: { from: other } });
    try {
      expect(
        (await own.commands.run('cat ~/workspace/OTHER.md; ls ~/repo 2>&1 || true')).stdout,
      ).toMatch(/^from the create\n.*No such file/s);
    } finally {
      await own.kill();
    }

    // A shared template is no way around the rule: the key that creates must pass it itself.
    // Here a key that is not an admin, from a local process of a user that cannot read the
    // folder (nobody; mkdtemp's folders are root's, mode 0700).
    const key = await ApiKeys.create('ws-tpl-plain', { home });
    const asNobody = (path: string, headers: string[], body: unknown) => {
      const out = execFileSync(
        'setpriv',
        ['--reuid=65534', '--regid=65534', '--clear-groups', 'curl', '-s', '-X', 'POST'].concat(
          ...headers.map((h) => ['-H', h]),
          ['-H', 'content-type: application/json', '--data', JSON.stringify(body)],
          ['-w', '\n%{http_code}', `${info.apiUrl}${path}`],
        ),
        { encoding: 'utf8' },
      );
      const at = out.lastIndexOf('\n');
      return { status: Number(out.slice(at + 1)), body: JSON.parse(out.slice(0, at)) };
    };
    const native = asNobody('/v1/sandboxes', [`authorization: Bearer ${key.key}`], {
      template: name,
    });
    expect(native.status).toBe(403);
    expect(native.body.error).toContain(`template '${name}' mounts a workspace`);
    expect(native.body.error).toContain(repo);
    // Through E2B's face too, in its { code, message } shape: the template's, and metadata's.
    const viaE2b = asNobody('/v2/sandboxes', [`x-api-key: ${key.key}`], { templateID: name });
    expect(viaE2b.status).toBe(403);
    expect(viaE2b.body.code).toBe(403);
    expect(viaE2b.body.message).toContain(`template '${name}' mounts a workspace`);
    const metaE2b = asNobody('/v2/sandboxes', [`x-api-key: ${key.key}`], {
      templateID: 'base',
      metadata: { 'abx.workspace': other },
    });
    expect(metaE2b.status).toBe(403);
    expect(metaE2b.body.message).toContain(other);
    // The same key from a user who can read it (root, this test) may: E2B's face passes on who
    // the local client is, as /v1 does.
    const e2b = { apiKey: key.key, apiUrl: info.apiUrl, sandboxUrl: info.gatewayUrl };
    const allowed = await E2bSandbox.create('base', {
      ...e2b,
      metadata: { 'abx.workspace': other },
    });
    try {
      expect((await allowed.commands.run('cat ~/workspace/OTHER.md')).stdout).toBe(
        'from the create\n',
      );
    } finally {
      await allowed.kill();
    }
  }, 90_000);

  test("E2B's SDK: a template's workspace, and metadata abx.workspace (FOLDER or FOLDER:PATH); bad values refused", async () => {
    const e2b = { apiKey: adminKey, apiUrl: info.apiUrl, sandboxUrl: info.gatewayUrl };
    const fromTemplate = await E2bSandbox.create(name, e2b);
    try {
      expect((await fromTemplate.commands.run('cat /home/user/repo/README.md')).stdout).toBe(
        'from the template\n',
      );
    } finally {
      await fromTemplate.kill();
    }
    const meta = await E2bSandbox.create('base', {
      ...e2b,
      metadata: { 'abx.workspace': `${other}:/home/user/code`, team: 'a' },
    });
    try {
      await meta.commands.run('rm /home/user/code/OTHER.md');
      expect(await changes(meta.sandboxId)).toEqual(['deleted OTHER.md']);
      expect(readFileSync(join(other, 'OTHER.md'), 'utf8')).toBe('from the create\n');
      expect((await meta.getInfo()).metadata).toMatchObject({ team: 'a' });
    } finally {
      await meta.kill();
    }
    const plain = await E2bSandbox.create('base', { ...e2b, metadata: { 'abx.workspace': other } });
    try {
      expect((await plain.commands.run('cat ~/workspace/OTHER.md')).stdout).toBe(
        'from the create\n',
      );
    } finally {
      await plain.kill();
    }
    for (const [value, reason] of [
      ['relative/dir', /400.*abx\.workspace must be an absolute folder/],
      [`${other}:home/x`, /400.*not an existing directory/],
      [`${other}:/etc`, /400.*workspace\.path/],
      [join(other, 'OTHER.md'), /400.*not an existing directory/],
    ] as const) {
      await expect(
        E2bSandbox.create('base', { ...e2b, metadata: { 'abx.workspace': value } }),
        value,
      ).rejects.toThrow(reason);
    }
    // Nothing was left running by the refusals.
    const running = await Sandbox.list({ home });
    expect(running.map((s) => s.sandboxId)).toEqual([]);
    const dirs = join(home, 'sandboxes');
    expect(existsSync(dirs) ? readdirSync(dirs) : []).toEqual([]);
  }, 90_000);
});
