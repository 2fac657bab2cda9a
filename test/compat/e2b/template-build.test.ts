import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BuildInfo, type LogEntry, Sandbox, Template, waitForFile } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon, stopDaemon } from '../../../src/installation/daemon-connection.js';
import { ApiKeys } from '../../../src/sandbox/api-keys.js';
import { removeTemplates } from '../../helpers/abx-home.js';
import { archive } from '../../helpers/crafted-tar.js';
import { DEBIAN_IMAGE, dockerEngine } from '../../helpers/docker-images.js';
import { type DockerHome, dockerHome } from './docker-home.js';
import { rawRequest } from './raw-request.js';

// E2B's Template SDK (the unmodified `e2b` package) against a daemon whose image templates are
// built on its Docker engine: a key's build from the machine's Debian image, then sandboxes of
// it. Two builds in all (they are the slow part), and one the daemon's restart interrupts.
const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`E2B template builds: skipped, ${engine.reason}`, () => {
    test('build', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;
  let alice: string;
  let bob: string;
  let context: string;
  const made: string[] = [];
  const suffix = Date.now().toString(36);
  const first = `e2b-built-${suffix}`;
  const second = `e2b-again-${suffix}`;
  const slow = `e2b-slow-${suffix}`;
  let firstBuild: BuildInfo | undefined;

  beforeAll(async () => {
    abx = await dockerHome(docker);
    process.env.E2B_API_URL = abx.info.apiUrl;
    process.env.E2B_SANDBOX_URL = abx.info.gatewayUrl;
    alice = (await ApiKeys.create(`alice-${suffix}`, { home: abx.home, format: 'e2b' })).key;
    bob = (await ApiKeys.create(`bob-${suffix}`, { home: abx.home, format: 'e2b' })).key;
    context = mkdtempSync(join(tmpdir(), 'e2b-template-'));
    writeFileSync(join(context, 'hello.txt'), 'hello from the upload\n');
  }, 900_000);

  afterAll(async () => {
    for (const id of made) await Sandbox.kill(id, { apiKey: alice }).catch(() => {});
    // Built images outlive the folder; so does the image the build the restart interrupted had
    // prepared (and its sandbox, if the restart failed before sweeping it).
    await removeTemplates(abx?.home);
    const builds = await docker
      .listContainers({ all: true, filters: { name: [`abx-build-${slow}-`] } })
      .catch(() => []);
    for (const container of builds) {
      await docker
        .getContainer(container.Id)
        .remove({ force: true })
        .catch(() => {});
    }
    const left = await docker
      .listImages({ filters: { reference: [`abx-template/${slow}`] } })
      .catch(() => []);
    for (const image of left) {
      await docker
        .getImage(image.Id)
        .remove({ force: true })
        .catch(() => {});
    }
    delete process.env.E2B_API_URL;
    delete process.env.E2B_SANDBOX_URL;
    if (context) rmSync(context, { recursive: true, force: true });
    await abx?.close();
  }, 120_000);

  const as = (apiKey: string) => ({ apiKey, requestTimeoutMs: 60_000 });
  const template = () =>
    Template({ fileContextPath: context })
      .fromImage(DEBIAN_IMAGE)
      .copy('hello.txt', '/home/user/hello.txt')
      .runCmd('cp /home/user/hello.txt /home/user/ran.txt && echo step-output-line')
      .setEnvs({ GREETING: 'hi from the template' })
      .setStartCmd(
        'echo "$GREETING" > /tmp/started && exec sleep 600',
        waitForFile('/tmp/started'),
      );

  test('Template.build from a local image; Sandbox.create(alias) has the file, the env and the start command', async () => {
    const logs: LogEntry[] = [];
    const built = await Template.build(template(), first, {
      ...as(alice),
      onBuildLogs: (entry) => logs.push(entry),
    });
    expect(built).toMatchObject({ templateId: first, name: first });
    firstBuild = built;
    const messages = logs.map((l) => l.message);
    expect(messages).toContain("Uploaded 'hello.txt'");
    expect(messages).toContain('step-output-line');
    expect(await Template.exists(first, as(alice))).toBe(true);

    const sandbox = await Sandbox.create(first, as(alice));
    made.push(sandbox.sandboxId);
    expect(await sandbox.files.read('/home/user/hello.txt')).toBe('hello from the upload\n');
    expect(await sandbox.files.read('/home/user/ran.txt')).toBe('hello from the upload\n');
    const run = await sandbox.commands.run(
      'echo "$GREETING"; cat /tmp/started; cat /proc/[0-9]*/comm',
    );
    const [env, started, ...commands] = run.stdout.trim().split('\n');
    expect(env).toBe('hi from the template');
    expect(started).toBe('hi from the template');
    // The start command runs on (it ends in `exec sleep 600`).
    expect(commands).toContain('sleep');
  }, 600_000);

  test("another key sees neither the build, its status nor the alias; the owner's second build reuses the upload", async () => {
    const logs: LogEntry[] = [];
    const info = await Template.buildInBackground(template(), second, {
      ...as(alice),
      onBuildLogs: (entry) => logs.push(entry),
    });
    expect(logs.map((l) => l.message)).toContain("Skipping upload of 'hello.txt', already cached");

    await expect(Template.getBuildStatus(info, as(bob))).rejects.toThrow(/not found/);
    expect(await Template.exists(first, as(bob))).toBe(false);
    await expect(Sandbox.create(first, as(bob))).rejects.toThrow(/not built|not exist/);

    const seen: string[] = [];
    const statuses = new Set<string>();
    let status = await Template.getBuildStatus(info, { ...as(alice), logsOffset: 0 });
    for (const deadline = Date.now() + 300_000; Date.now() < deadline; ) {
      statuses.add(status.status);
      seen.push(...status.logEntries.map((e) => e.message));
      if (status.status !== 'building') break;
      await new Promise((resolve) => setTimeout(resolve, 300));
      status = await Template.getBuildStatus(info, { ...as(alice), logsOffset: seen.length });
    }
    expect(status.status).toBe('ready');
    expect(statuses.has('building')).toBe(true);
    // Each line once: the offsets move past what was read.
    expect(seen.filter((line) => line === 'step-output-line')).toHaveLength(1);
    expect(seen.at(-1)).toBe(`template ${second} is built`);
  }, 600_000);

  test("fromTemplate builds on a template the key may use, with its files and env; another key's is unknown", async () => {
    const onTop = `e2b-on-${suffix}`;
    const layered = Template()
      .fromTemplate(first)
      .runCmd('cat /home/user/ran.txt > /home/user/on-top.txt');
    await Template.build(layered, onTop, as(alice));
    const sandbox = await Sandbox.create(onTop, as(alice));
    made.push(sandbox.sandboxId);
    const run = await sandbox.commands.run('cat /home/user/on-top.txt; echo "$GREETING"; id -un');
    expect(run.stdout).toBe('hello from the upload\nhi from the template\nuser\n');

    // To bob, alice's template is a name that was never built: the same answer.
    const refusal = async (base: string) => {
      const attempt = Template().fromTemplate(base).runCmd('true');
      const error = await Template.build(attempt, `e2b-bob-${suffix}`, as(bob)).catch((e) => e);
      return (error as Error).message.replace(base, 'NAME');
    };
    const hidden = await refusal(first);
    expect(hidden).toMatch(/404|not built|not found/);
    expect(hidden).toBe(await refusal(`never-built-${suffix}`));
    expect(await Template.exists(`e2b-bob-${suffix}`, as(bob))).toBe(false);
  }, 300_000);

  test('a step abx cannot express is refused by name, and nothing is built', async () => {
    const rooted = Template({ fileContextPath: context })
      .fromImage(DEBIAN_IMAGE)
      .setUser('root')
      .runCmd('id');
    await expect(Template.build(rooted, `e2b-root-${suffix}`, as(alice))).rejects.toThrow(
      // This daemon (Docker) gives its sandboxes no root: a template whose last user is root.
      /setUser\('root'\) as the template's last user asks for sandboxes that run as root, which this daemon cannot give/,
    );
    const based = Template().fromTemplate('base').runCmd('true');
    await expect(Template.build(based, `e2b-base-${suffix}`, as(alice))).rejects.toThrow(
      /fromTemplate\("base"\) is not supported by abx for this template: it has no image of its own/,
    );
    expect(await Template.exists(`e2b-root-${suffix}`, as(alice))).toBe(false);
    // One build per template: no tag but default, which always names the latest.
    await expect(Template.assignTags(`${first}:default`, ['v2'], as(alice))).rejects.toThrow(
      /assigning tags "v2" of ".*:default" is not supported by abx: a template keeps one build/,
    );
    await expect(Template.removeTags(first, 'default', as(alice))).rejects.toThrow(
      /removing tags is not supported by abx: a template keeps one build/,
    );
  }, 120_000);

  test('uploads: a bad hash and an archive that leaves its folder are refused; a link is used once', async () => {
    const api = abx.info.apiUrl;
    const key = { 'x-api-key': alice };
    const bad = await rawRequest(api, {
      method: 'GET',
      path: `/templates/${first}/files/not-a-hash`,
      headers: key,
    });
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.body.toString())).toMatchObject({ code: 400 });
    const hash = 'ab'.repeat(32);
    const link = await rawRequest(api, {
      method: 'GET',
      path: `/templates/${first}/files/${hash}`,
      headers: key,
    });
    const { present, url } = JSON.parse(link.body.toString()) as { present: boolean; url: string };
    expect(present).toBe(false);
    const target = new URL(url);
    const escaping = archive([{ name: '../outside.txt', body: 'x' }]);
    const put = (body: Buffer) =>
      rawRequest(api, {
        method: 'PUT',
        path: `${target.pathname}${target.search}`,
        headers: { 'content-type': 'application/octet-stream' },
        body,
      });
    const refused = await put(escaping);
    expect(refused.status).toBe(400);
    expect(refused.body.toString()).toMatch(/\.\./);
    // Used: the same link takes nothing more.
    const again = await put(archive([{ name: 'fine.txt', body: 'x' }]));
    expect(again.status).toBe(400);
    expect(again.body.toString()).toMatch(/unknown, used or expired/);
    const after = await rawRequest(api, {
      method: 'GET',
      path: `/templates/${first}/files/${hash}`,
      headers: key,
    });
    expect(JSON.parse(after.body.toString())).toMatchObject({ present: false });
  }, 60_000);

  test('after a daemon restart: a finished build still answers; one that was running reads as stopped', async () => {
    const sleeper = Template({ fileContextPath: context })
      .fromImage(DEBIAN_IMAGE)
      .runCmd('echo slow-step-started && sleep 300');
    const info = await Template.buildInBackground(sleeper, slow, as(alice));
    const seen: string[] = [];
    for (let deadline = Date.now() + 120_000; !seen.includes('slow-step-started'); ) {
      expect(Date.now()).toBeLessThan(deadline);
      const status = await Template.getBuildStatus(info, {
        ...as(alice),
        logsOffset: seen.length,
      });
      expect(status.status).toBe('building');
      seen.push(...status.logEntries.map((e) => e.message));
      await new Promise((resolve) => setTimeout(resolve, 300));
    }

    expect(await stopDaemon(abx.home)).toBe(true);
    abx.info = await startDaemon(abx.home);
    process.env.E2B_API_URL = abx.info.apiUrl;
    process.env.E2B_SANDBOX_URL = abx.info.gatewayUrl;

    // The stopped build's sandbox is gone: the new daemon's start removed it.
    const left = await docker.listContainers({
      all: true,
      filters: { name: [`abx-build-${slow}-`] },
    });
    expect(left.map((c) => c.Names)).toEqual([]);

    const stopped = await Template.getBuildStatus(info, as(alice));
    expect(stopped.status).toBe('error');
    expect(stopped.reason?.message).toMatch(/the daemon stopped while this template was building/);
    // The lines logged before the stop are kept, at the same offsets.
    expect(stopped.logEntries.map((e) => e.message).slice(0, seen.length)).toEqual(seen);
    expect(await Template.exists(slow, as(alice))).toBe(false);
    // Still another key's: a restart changes no owner.
    await expect(Template.getBuildStatus(info, as(bob))).rejects.toThrow(/not found/);

    if (!firstBuild) throw new Error('the first test did not build');
    const ready = await Template.getBuildStatus(firstBuild, as(alice));
    expect(ready.status).toBe('ready');
    expect(ready.logEntries.map((e) => e.message)).toContain('step-output-line');
    expect(await Template.getTags(first, as(alice))).toMatchObject([
      { tag: 'default', buildId: firstBuild.buildId },
    ]);
  }, 300_000);
}
