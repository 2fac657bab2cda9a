import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { verifySandboxNode } from '../../src/control/node-line.js';
import { NodeLineError, Sandbox, Template, Templates } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { LocalProvider } from '../../src/providers/local/local-provider.js';
import { CLI, runProgram } from '../cli/abx.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { BUSYBOX_IMAGE, dockerEngine, ensureBusyboxImage } from '../helpers/docker-images.js';

// Which Node each kind of sandbox runs, on whatever line runs these tests (CI: the whole suite on
// 24, then 22 and 26 in its matrix, each first on PATH). The daemon runs on this test's Node
// (process.execPath); sandboxes without an image run the host's /usr/bin/node; image sandboxes
// run the portable runtime's copy of the daemon's. When the two lines differ (CI), doctor says
// so and a template's `runtime: { node }` decides which sandboxes it may run in.

const HOST_NODE = '/usr/bin/node';
const hostVersion = execFileSync(HOST_NODE, ['--version'], { encoding: 'utf8' }).trim();
const lineOf = (version: string) => Number(/^v(\d+)\./.exec(version)?.[1]);
const daemonLine = lineOf(process.version);
const hostLine = lineOf(hostVersion);
/** Lines the two kinds of sandbox here do not both run (a line none runs when they agree). */
const notForHost = hostLine === daemonLine ? hostLine + 2 : daemonLine;
const notForImages = hostLine === daemonLine ? daemonLine + 2 : hostLine;
const isRoot = process.getuid?.() === 0;
const engine = isRoot ? await dockerEngine() : { reason: 'image sandboxes need a root daemon' };

/** `abx doctor --json` run by `node`, as `$ABX_HOME` `home`: its two Node checks. */
async function doctorNode(node: string, home: string) {
  const { stdout, code } = await runProgram(node, [CLI, 'doctor', '--json'], {
    env: { ABX_HOME: home, NO_COLOR: '1', DOCKER_HOST: 'unix:///nonexistent.sock' },
  });
  const report = JSON.parse(stdout) as {
    checks: { name: string; status: string; found: string; fix?: string }[];
  };
  const check = (name: string) => report.checks.find((c) => c.name === name);
  return { code, daemon: check('node (daemon)'), sandboxes: check('node (sandboxes)') };
}

describe.runIf(isRoot)('the Node each sandbox runs, and the daemon’s', () => {
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let home: string;

  beforeAll(async () => {
    process.env.ABX_WARM_POOL = '0';
    abx = await createAbxHome();
    home = abx.home;
  }, 120_000);

  afterAll(async () => {
    await removeTemplates(home);
    await abx?.close();
    delete process.env.ABX_WARM_POOL;
  });

  test('a sandbox without an image runs the host’s /usr/bin/node; the daemon this test’s Node, which daemon.json names', async () => {
    const box = await Sandbox.create({ home });
    try {
      expect((await box.commands.run('command -v node; node --version')).stdout).toBe(
        `${process.execPath.startsWith('/usr/') ? process.execPath : HOST_NODE}\n${hostVersion}\n`,
      );
    } finally {
      await box.kill();
    }
    const info = JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8'));
    expect(info.node).toEqual({ version: process.version, path: process.execPath });
  });

  test('doctor reports the running daemon’s Node and the sandboxes’, with a warning when they are two lines', async () => {
    await Sandbox.list({ home }); // the daemon runs
    const pid = JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')).pid;
    // Doctor on the host's Node still reports the running daemon's, not its own.
    const report = await doctorNode(HOST_NODE, home);
    // (Node 20 adds that its line is past its end of life.)
    expect(report.daemon?.found).toMatch(
      new RegExp(
        `^${process.version} at ${process.execPath} \\(the running daemon, pid ${pid}\\)($|: )`,
      ),
    );
    expect(report.sandboxes?.found).toContain(
      `${hostVersion} at ${HOST_NODE} (sandboxes without an image); image sandboxes run the daemon's ${process.version} from the portable runtime`,
    );
    if (hostLine === daemonLine) {
      expect(report.sandboxes?.status).toBe('ok');
    } else {
      expect(report.sandboxes?.status).toBe('warning');
      expect(report.sandboxes?.found).toContain(
        `two Node lines, ${hostLine} in sandboxes without an image and ${daemonLine} in the daemon and image sandboxes`,
      );
      expect(report.sandboxes?.fix).toContain(`install Node ${daemonLine} as ${HOST_NODE}`);
      expect(report.sandboxes?.fix).toContain(`runtime: { node: ${daemonLine} }`);
    }
    expect(report.code).toBe(0);
  }, 120_000);

  test('with no daemon running, doctor reports the Node it runs on: on the host’s own, one line and no warning', async () => {
    const empty = mkdtempSync(join(tmpdir(), 'abx-node-doctor-'));
    try {
      const own = await doctorNode(HOST_NODE, empty);
      expect(own.daemon?.found).toMatch(
        new RegExp(
          `^${hostVersion} at ${HOST_NODE} \\(\`abx daemon start\` starts the daemon on it\\)`,
        ),
      );
      expect(own.sandboxes?.status).toBe('ok');
      const mine = await doctorNode(process.execPath, empty);
      expect(mine.daemon?.found).toMatch(new RegExp(`^${process.version} at `));
      expect(mine.sandboxes?.status).toBe(hostLine === daemonLine ? 'ok' : 'warning');
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  }, 120_000);

  test('runtime: { node } on a template without an image: built when the host’s line is it, refused naming both versions when not', async () => {
    const fits = await Templates.build(Template.fromBase().requireNode(hostLine), {
      home,
      name: 'host-node-fits',
    });
    expect(fits.runtime).toEqual({ node: hostLine });
    const box = await Sandbox.create({ home, template: 'host-node-fits' });
    try {
      expect((await box.commands.run('node --version')).stdout).toBe(`${hostVersion}\n`);
    } finally {
      await box.kill();
    }
    const refused = await Templates.build(Template.fromBase().requireNode(notForHost), {
      home,
      name: 'host-node-wrong',
    }).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(NodeLineError);
    const message = (refused as Error).message;
    expect(message).toContain(
      `template 'host-node-wrong' needs Node ${notForHost} (runtime: { node: ${notForHost} }), but its sandboxes here would run Node ${hostVersion}: the host's ${HOST_NODE}`,
    );
    expect(message).toContain(`install Node ${notForHost} as ${HOST_NODE}`);
    expect(message).toContain(`whose sandboxes run the daemon's own Node, ${process.version}`);
    expect((await Templates.list({ home })).map((t) => t.name)).not.toContain('host-node-wrong');
  }, 120_000);

  test('a started sandbox’s envd is asked which Node it runs: another line than needed is a NodeLineError', async () => {
    // What a create checks, whatever changed since the build: here straight on the provider.
    const provider = new LocalProvider({ runtimeDir: join(ROOT, 'dist', 'runtime') });
    const dir = mkdtempSync(join(tmpdir(), 'abx-node-verify-'));
    const accessToken = randomBytes(16).toString('hex');
    const handle = await provider.create({
      id: `node-verify-${randomBytes(4).toString('hex')}`,
      accessToken,
      dir,
      env: {},
      workdir: '/home/user',
      resources: {},
      network: 'none',
    });
    try {
      await verifySandboxNode('t', hostLine, provider, false, handle, accessToken);
      const refused = await verifySandboxNode('t', notForHost, provider, false, handle, accessToken)
        .then(() => undefined)
        .catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(NodeLineError);
      expect((refused as NodeLineError).details).toEqual({
        needed: notForHost,
        found: hostVersion,
      });
      expect((refused as Error).message).toContain(
        `needs Node ${notForHost} (runtime: { node: ${notForHost} }), but its sandboxes here run Node ${hostVersion}`,
      );
    } finally {
      await provider.kill(handle);
      await provider.close?.();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  describe.skipIf(!('docker' in engine && engine.docker))(
    `image sandboxes${'reason' in engine ? ` (skipped: ${engine.reason})` : ''}`,
    () => {
      beforeAll(async () => {
        if ('docker' in engine && engine.docker) await ensureBusyboxImage(engine.docker);
      }, 300_000);

      test('an image sandbox runs the daemon’s Node (the portable runtime’s copy); runtime: { node } follows it', async () => {
        const built = await Templates.build(
          Template.fromImage(BUSYBOX_IMAGE).requireNode(daemonLine),
          { home, name: 'image-node-fits' },
        );
        expect(built.runtime).toEqual({ node: daemonLine });
        const box = await Sandbox.create({ home, template: 'image-node-fits' });
        try {
          expect((await box.commands.run('command -v node; node --version')).stdout).toBe(
            `/opt/abx/bin/node\n${process.version}\n`,
          );
        } finally {
          await box.kill();
        }
        const refused = await Templates.build(
          Template.fromImage(BUSYBOX_IMAGE).requireNode(notForImages),
          { home, name: 'image-node-wrong' },
        ).catch((error: unknown) => error);
        expect(refused).toBeInstanceOf(NodeLineError);
        expect((refused as Error).message).toContain(
          `needs Node ${notForImages} (runtime: { node: ${notForImages} }), but its sandboxes here would run Node ${process.version}: the daemon's own Node (${process.execPath}), which the portable runtime copies into the sandbox. To run Node ${notForImages} there, start the daemon with Node ${notForImages}`,
        );
      }, 600_000);
    },
  );
});

describe.runIf(isRoot)('the docker provider’s sandboxes run the daemon’s Node', () => {
  test.skipIf(!('docker' in engine && engine.docker))(
    `every docker sandbox runs the portable runtime's copy of it${'reason' in engine ? ` (skipped: ${engine.reason})` : ''}`,
    async () => {
      if ('docker' in engine && engine.docker) await ensureBusyboxImage(engine.docker);
      // Read by the daemon this test starts (the provider and its image for templates without one).
      const saved = { ...process.env };
      Object.assign(process.env, {
        ABX_PROVIDER: 'docker',
        ABX_DOCKER_BASE_IMAGE: BUSYBOX_IMAGE,
        ABX_WARM_POOL: '0',
      });
      const abx = await createAbxHome();
      try {
        expect((await startDaemon(abx.home)).provider).toBe('docker');
        const box = await Sandbox.create({ home: abx.home });
        try {
          expect((await box.commands.run('command -v node; node --version')).stdout).toBe(
            `/opt/abx/bin/node\n${process.version}\n`,
          );
        } finally {
          await box.kill();
        }
      } finally {
        await abx.close();
        for (const name of ['ABX_PROVIDER', 'ABX_DOCKER_BASE_IMAGE', 'ABX_WARM_POOL']) {
          if (saved[name] === undefined) delete process.env[name];
          else process.env[name] = saved[name];
        }
      }
    },
    600_000,
  );
});
