import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { verifySandboxNode } from '../../src/control/node-line.js';
import { NodeLineError, Sandbox, Template, Templates } from '../../src/index.js';
import { findDaemon, startDaemon } from '../../src/installation/daemon-connection.js';
import { LocalProvider } from '../../src/providers/local/local-provider.js';
import {
  hostSandboxNode,
  nodeSatisfies,
  noImageNode,
} from '../../src/providers/local/sandbox-node.js';
import { SANDBOX_NODE, SANDBOX_NODE_DIR } from '../../src/providers/portable-runtime.js';
import { CLI, runProgram } from '../cli/abx.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { BUSYBOX_IMAGE, dockerEngine, ensureBusyboxImage } from '../helpers/docker-images.js';
import { BIND_THEN_EXEC, inPrivateMounts } from '../helpers/host-ns.js';
import { startRootlessDaemon } from '../helpers/rootless.js';

// Which Node each kind of sandbox runs, on whatever line runs these tests (CI: the whole suite on
// 24, then 22 and 26 in its matrix, each first on PATH). The daemon runs on this test's Node
// (process.execPath). Sandboxes without an image run the host's /usr Node when it is a supported
// line (package.json's engines), else the portable runtime's copy of the daemon's, at /opt/abx, as
// image sandboxes do. Here the host's /usr/bin/node is Node 20, not a supported line: the second.
// The first is run here too, by a daemon in a mount namespace of its own whose /usr/bin/node is
// another line's official build (scripts/node-line.sh 22): what its sandboxes see of /usr.

const HOST_NODE = '/usr/bin/node';
const hostVersion = execFileSync(HOST_NODE, ['--version'], { encoding: 'utf8' }).trim();
const lineOf = (version: string) => Number(/^v(\d+)\./.exec(version)?.[1]);
const daemonLine = lineOf(process.version);
const hostLine = lineOf(hostVersion);
const hostSupported = nodeSatisfies(hostVersion);
/** What a sandbox without an image runs here: where `node` is, where envd's is, which version. */
const noImage = hostSupported
  ? { onPath: hostSandboxNode(), envd: hostSandboxNode(), version: hostVersion }
  : { onPath: `${SANDBOX_NODE_DIR}/node`, envd: SANDBOX_NODE, version: process.version };
const noImageLine = lineOf(noImage.version);
/** Lines the two kinds of sandbox here do not run (a line none runs when they agree). */
const notForNoImage = hostSupported
  ? hostLine === daemonLine
    ? hostLine + 2
    : daemonLine
  : hostLine;
const notForImages = noImageLine === daemonLine ? daemonLine + 2 : noImageLine;
const isRoot = process.getuid?.() === 0;
const engine = isRoot ? await dockerEngine() : { reason: 'image sandboxes need a root daemon' };

/**
 * What runs Node in a sandbox, seen from inside: `node` on PATH and its version, envd's Node (the
 * sandbox's pid 2, bwrap's init being 1) and its version, what a JavaScript code context runs, and
 * the command server's Node once started.
 */
async function nodesIn(box: Sandbox) {
  const shell = await box.commands.run(
    // pid 2 is envd's front (the Node it starts comes after its `--`), or the shell loop envd
    // runs under (its child) without one, or envd.
    'command -v node; node --version; envd=$(readlink /proc/2/exe); case "$envd" in */envd-front) envd=$(tr "\\0" "\\n" < /proc/2/cmdline | sed -n "/^--$/{n;p;q}");; */sh|*/dash|*/bash|*/ash|*/busybox) envd=$(readlink /proc/$(cut -d" " -f1 /proc/2/task/2/children)/exe);; esac; echo "$envd"; "$envd" --version',
  );
  const [onPath, version, envd, envdVersion] = shell.stdout.trim().split('\n');
  const code = (
    await box.runCode('process.execPath + " " + process.version', { language: 'javascript' })
  ).text;
  await box.server.start();
  // Every process running server.cjs (the started one, and the idle one envd keeps ahead).
  const servers = await box.commands.run(
    'for p in /proc/[0-9]*; do if tr "\\0" " " < $p/cmdline 2>/dev/null | grep -q "server[.]cjs"; then readlink $p/exe; fi; done | sort -u',
  );
  await box.server.stop();
  return { onPath, version, envd, envdVersion, code, servers: servers.stdout.trim() };
}

/** A template without an image that may run the command server (`ports`), in `home`. */
async function serverTemplate(home: string): Promise<string> {
  const name = 'node-server';
  const have = await Templates.list({ home });
  if (!have.some((t) => t.name === name)) {
    await Templates.build(
      Template.fromBase().setCapabilities(['shell', 'files', 'code', 'ports']),
      {
        home,
        name,
      },
    );
  }
  return name;
}

/** `abx doctor --json` run by `node`, as `$ABX_HOME` `home`: its two Node checks. */
async function doctorNode(node: string, home: string, hostNode?: string) {
  const args = [CLI, 'doctor', '--json'];
  const [unshare, ...bound] = inPrivateMounts(BIND_THEN_EXEC, 'abx-doctor', [
    hostNode ?? '',
    HOST_NODE,
    node,
    ...args,
  ]);
  const { stdout, code } = hostNode
    ? await runProgram(unshare, bound, {
        env: { ABX_HOME: home, NO_COLOR: '1', DOCKER_HOST: 'unix:///nonexistent.sock' },
      })
    : await runProgram(node, args, {
        env: { ABX_HOME: home, NO_COLOR: '1', DOCKER_HOST: 'unix:///nonexistent.sock' },
      });
  const report = JSON.parse(stdout) as {
    checks: {
      name: string;
      status: string;
      found: string;
      fix?: string;
      details?: {
        withoutImage: { runtime: string; node: string; version: string; why: string };
        withImage: { runtime: string; version: string };
      };
    }[];
  };
  const check = (name: string) => report.checks.find((c) => c.name === name);
  return { code, daemon: check('node (daemon)'), sandboxes: check('node (sandboxes)') };
}

/** Another supported line's official Node than the daemon's (22 here), or why there is none. */
function otherSupportedNode(): { path: string; version: string } | { reason: string } {
  const line = daemonLine === 22 ? 24 : 22;
  try {
    const path = execFileSync(join(ROOT, 'scripts', 'node-line.sh'), [String(line)], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 300_000,
    }).trim();
    return { path, version: execFileSync(path, ['--version'], { encoding: 'utf8' }).trim() };
  } catch (error) {
    return {
      reason: `no Node ${line} here (scripts/node-line.sh ${line}): ${(error as Error).message.split('\n')[0]}`,
    };
  }
}

/**
 * A root daemon for `home` in a mount namespace of its own where `hostNode` is bound over
 * /usr/bin/node: the host its sandboxes see has that Node, the rest of this machine does not.
 */
async function rootDaemonWithHostNode(home: string, hostNode: string): Promise<void> {
  const log = openSync(join(home, 'daemon.log'), 'a');
  const [unshare, ...args] = inPrivateMounts(BIND_THEN_EXEC, 'abx-node', [
    hostNode,
    HOST_NODE,
    process.execPath,
    join(ROOT, 'dist', 'daemon.js'),
  ]);
  const child = spawn(unshare, args, {
    detached: true,
    stdio: ['ignore', log, log],
    env: { ...process.env, ABX_HOME: home, ABX_WARM_POOL: '0' },
  });
  closeSync(log);
  child.unref();
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    const info = await findDaemon(home).catch(() => undefined);
    if (info?.pid === child.pid) return;
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`the daemon did not start:\n${readFileSync(join(home, 'daemon.log'), 'utf8')}`);
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

  test(`a sandbox without an image runs ${hostSupported ? 'the host’s /usr Node' : 'the portable runtime (the host’s Node is not a supported line)'}: node on PATH, envd, code contexts and the command server alike; the daemon this test’s Node`, async () => {
    const box = await Sandbox.create({ home, template: await serverTemplate(home) });
    try {
      const nodes = await nodesIn(box);
      expect(nodes).toEqual({
        onPath: noImage.onPath,
        version: noImage.version,
        envd: noImage.envd,
        envdVersion: noImage.version,
        code: expect.stringContaining(`${noImage.envd} ${noImage.version}`),
        servers: noImage.envd,
      });
      if (!hostSupported) {
        // Here: Node 20 on the host, the daemon's line in the sandbox.
        expect(nodes.version).not.toBe(hostVersion);
        expect(nodes.version).toBe(process.version);
      }
    } finally {
      await box.kill();
    }
    const info = JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8'));
    expect(info.node).toEqual({ version: process.version, path: process.execPath });
  }, 120_000);

  test('doctor reports the running daemon’s Node and which Node sandboxes get, and why', async () => {
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
    const images = `image sandboxes: Node ${process.version} (the portable runtime: the daemon's own)`;
    if (hostSupported) {
      expect(report.sandboxes?.found).toContain(
        `sandboxes without an image: Node ${hostVersion} (the host's ${hostSandboxNode()}, a supported line`,
      );
      expect(report.sandboxes?.status).toBe(hostLine === daemonLine ? 'ok' : 'warning');
    } else {
      expect(report.sandboxes?.found).toBe(
        `sandboxes without an image: Node ${process.version} (the portable runtime: the host's ${HOST_NODE} is ${hostVersion}, not a supported line (^22.13 || ^24 || ^26)); ${images}`,
      );
      expect(report.sandboxes?.status).toBe('ok');
    }
    // --json carries it as data too.
    expect(report.sandboxes?.details).toMatchObject({
      withoutImage: {
        runtime: hostSupported ? 'host' : 'portable',
        node: noImage.envd,
        version: noImage.version,
      },
      withImage: { runtime: 'portable', version: process.version },
    });
    expect(report.code).toBe(0);
  }, 120_000);

  test('with no daemon running, doctor reports the Node it runs on and what sandboxes would get on it', async () => {
    const empty = mkdtempSync(join(tmpdir(), 'abx-node-doctor-'));
    try {
      const own = await doctorNode(HOST_NODE, empty);
      expect(own.daemon?.found).toMatch(
        new RegExp(
          `^${hostVersion} at ${HOST_NODE} \\(\`abx daemon start\` starts the daemon on it\\)`,
        ),
      );
      // A daemon on the host's own Node: one line everywhere, supported or not (the runtime
      // would copy that same Node); an unsupported one warns, with the fix.
      expect(own.sandboxes?.details?.withoutImage).toMatchObject({
        runtime: 'host',
        version: hostVersion,
      });
      if (hostSupported) {
        expect(own.sandboxes?.status).toBe('ok');
      } else {
        expect(own.sandboxes?.status).toBe('warning');
        expect(own.sandboxes?.found).toContain(
          `the host's ${HOST_NODE} is ${hostVersion}, not a supported line (^22.13 || ^24 || ^26), and neither is the daemon's ${hostVersion} that the portable runtime would copy`,
        );
        expect(own.sandboxes?.fix).toContain(`install Node 24 (or 22, 26) as ${HOST_NODE}`);
      }
      const mine = await doctorNode(process.execPath, empty);
      expect(mine.daemon?.found).toMatch(new RegExp(`^${process.version} at `));
      expect(mine.sandboxes?.details?.withoutImage.version).toBe(noImage.version);
      expect(mine.sandboxes?.status).toBe(noImageLine === daemonLine ? 'ok' : 'warning');
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  }, 120_000);

  test('runtime: { node } on a template without an image follows the Node its sandboxes get: built for that line, refused naming both versions for another', async () => {
    const fits = await Templates.build(Template.fromBase().requireNode(noImageLine), {
      home,
      name: 'host-node-fits',
    });
    expect(fits.runtime).toEqual({ node: noImageLine });
    const box = await Sandbox.create({ home, template: 'host-node-fits' });
    try {
      expect((await box.commands.run('node --version')).stdout).toBe(`${noImage.version}\n`);
    } finally {
      await box.kill();
    }
    const refused = await Templates.build(Template.fromBase().requireNode(notForNoImage), {
      home,
      name: 'host-node-wrong',
    }).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(NodeLineError);
    const message = (refused as Error).message;
    expect(message).toContain(
      `template 'host-node-wrong' needs Node ${notForNoImage} (runtime: { node: ${notForNoImage} }), but its sandboxes here would run Node ${noImage.version}: `,
    );
    if (hostSupported) {
      expect(message).toContain(`the host's ${hostSandboxNode()}`);
      expect(message).toContain(`install Node ${notForNoImage} as ${hostSandboxNode()}`);
      expect(message).toContain(`whose sandboxes run the daemon's own Node, ${process.version}`);
    } else {
      // Node 20 here: asking for the host's own line is refused, since sandboxes do not run it.
      expect(message).toContain(
        `the portable runtime's copy of the daemon's own Node (${process.execPath}): sandboxes without an image run on it because the host's ${HOST_NODE} is ${hostVersion}, not a supported line`,
      );
      expect(message).toContain(`start the daemon with Node ${notForNoImage}`);
    }
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
      const { body } = await envdRequest<{ node?: string }>(
        handle.envdSocket,
        accessToken,
        'GET',
        '/info',
        undefined,
        10_000,
      );
      expect(body.node).toBe(noImage.version);
      expect((await provider.sandboxNode(false)).version).toBe(noImage.version);
      await verifySandboxNode('t', noImageLine, provider, false, handle, accessToken);
      const refused = await verifySandboxNode(
        't',
        notForNoImage,
        provider,
        false,
        handle,
        accessToken,
      )
        .then(() => undefined)
        .catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(NodeLineError);
      expect((refused as NodeLineError).details).toEqual({
        needed: notForNoImage,
        found: noImage.version,
      });
      expect((refused as Error).message).toContain(
        `needs Node ${notForNoImage} (runtime: { node: ${notForNoImage} }), but its sandboxes here run Node ${noImage.version}`,
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

const other = isRoot
  ? otherSupportedNode()
  : { reason: 'binding a Node over /usr/bin/node needs root' };

describe.runIf(isRoot)(
  'a host whose /usr/bin/node is a supported line keeps it (a daemon in a mount namespace whose /usr/bin/node is another supported line)',
  () => {
    test.skipIf(!('path' in other))(
      `root daemon: sandboxes without an image run the host’s Node, with no /opt/abx Node on PATH; doctor says so${'reason' in other ? ` (skipped: ${other.reason})` : ''}`,
      async () => {
        const node = other as { path: string; version: string };
        const abx = await createAbxHome();
        try {
          await rootDaemonWithHostNode(abx.home, node.path);
          const box = await Sandbox.create({
            home: abx.home,
            template: await serverTemplate(abx.home),
          });
          try {
            expect(await nodesIn(box)).toEqual({
              onPath: HOST_NODE,
              version: node.version,
              envd: HOST_NODE,
              envdVersion: node.version,
              code: expect.stringContaining(`${HOST_NODE} ${node.version}`),
              servers: HOST_NODE,
            });
            expect((await box.commands.run('echo "$PATH"')).stdout).not.toContain('/opt/abx');
          } finally {
            await box.kill();
          }
          const report = await doctorNode(process.execPath, abx.home, node.path);
          expect(report.sandboxes?.details?.withoutImage).toMatchObject({
            runtime: 'host',
            node: HOST_NODE,
            version: node.version,
          });
          // Two lines, the host's and the daemon's: a warning naming both.
          expect(report.sandboxes?.status).toBe('warning');
          expect(report.sandboxes?.found).toContain(
            `sandboxes without an image: Node ${node.version} (the host's ${HOST_NODE}, a supported line`,
          );
          expect(report.sandboxes?.found).toContain(
            `two Node lines, ${lineOf(node.version)} in sandboxes without an image and ${daemonLine} in the daemon and image sandboxes`,
          );
        } finally {
          await abx.close();
        }
      },
      300_000,
    );

    test.skipIf(!('path' in other))(
      `rootless daemon: the same${'reason' in other ? ` (skipped: ${other.reason})` : ''}`,
      async () => {
        const node = other as { path: string; version: string };
        const daemon = await startRootlessDaemon({
          binds: [[node.path, HOST_NODE]],
          env: { ABX_WARM_POOL: '0' },
        });
        try {
          const box = await Sandbox.create({
            home: daemon.home,
            template: await serverTemplate(daemon.home),
          });
          try {
            expect(await nodesIn(box)).toEqual({
              onPath: HOST_NODE,
              version: node.version,
              envd: HOST_NODE,
              envdVersion: node.version,
              code: expect.stringContaining(`${HOST_NODE} ${node.version}`),
              servers: HOST_NODE,
            });
          } finally {
            await box.kill();
          }
          // No portable runtime was needed (the cache folder may hold the sandboxes' shared CA
          // bundle, trust/, and nothing built).
          const cache = join(daemon.runtimeDir, 'abx-runtime');
          const built = existsSync(cache)
            ? readdirSync(cache).filter((name) => name.startsWith('portable-'))
            : [];
          expect(built).toEqual([]);
        } finally {
          await daemon.close();
        }
      },
      300_000,
    );
  },
);

describe.runIf(isRoot && !hostSupported)(
  'a rootless daemon on a host whose Node is not a supported line',
  () => {
    test('its sandboxes without an image run the portable runtime, built in the daemon user’s $XDG_RUNTIME_DIR (its uid is the sandboxes’; never under $ABX_HOME, whose path must not show inside)', async () => {
      const daemon = await startRootlessDaemon({ env: { ABX_WARM_POOL: '0' } });
      try {
        const box = await Sandbox.create({
          home: daemon.home,
          template: await serverTemplate(daemon.home),
        });
        try {
          expect(await nodesIn(box)).toEqual({
            onPath: `${SANDBOX_NODE_DIR}/node`,
            version: process.version,
            envd: SANDBOX_NODE,
            envdVersion: process.version,
            code: expect.stringContaining(`${SANDBOX_NODE} ${process.version}`),
            servers: SANDBOX_NODE,
          });
          const seen = await box.commands.run(
            'tr "\\0" " " < /proc/1/cmdline; cat /proc/self/mountinfo',
          );
          expect(seen.stdout).toContain(`${daemon.runtimeDir}/abx-runtime/portable-`);
          expect(seen.stdout).not.toContain(daemon.home);
        } finally {
          await box.kill();
        }
        expect(
          readdirSync(join(daemon.runtimeDir, 'abx-runtime')).filter((n) =>
            n.startsWith('portable-'),
          ),
        ).toHaveLength(1);
      } finally {
        await daemon.close();
      }
    }, 300_000);
  },
);

describe('which Node a sandbox without an image gets: the choice itself', () => {
  test('package.json’s engines range decides what is a supported line', () => {
    const range = '^22.13 || ^24 || ^26';
    expect(
      ['v22.13.0', 'v22.23.5', 'v24.0.0', 'v24.22.3', 'v26.12.1'].filter((v) =>
        nodeSatisfies(v, range),
      ),
    ).toHaveLength(5);
    for (const version of [
      'v20.20.2',
      'v22.12.0',
      'v23.11.0',
      'v25.1.0',
      'v27.0.0',
      'not a version',
    ]) {
      expect(nodeSatisfies(version, range), version).toBe(false);
    }
    expect(nodeSatisfies('v24.22.3')).toBe(true); // the package's own range
  });

  test('an unsupported host Node with no buildable runtime: the host’s, saying why; no Node at all: a SandboxStartError naming both', async () => {
    const failing = () => Promise.reject(new Error('patchelf is not installed'));
    const daemon = { path: process.execPath, version: process.version };
    const choice = await noImageNode({ daemon, portable: failing });
    if (hostSupported) {
      expect(choice).toMatchObject({ runtime: 'host', version: hostVersion, supported: true });
      return;
    }
    expect(choice).toMatchObject({
      runtime: 'host',
      node: HOST_NODE,
      version: hostVersion,
      supported: false,
      fallback: 'patchelf is not installed',
    });
    expect(choice.why).toBe(
      `the host's ${HOST_NODE} is ${hostVersion}, not a supported line (^22.13 || ^24 || ^26), and the portable runtime could not be built, so the host's runs anyway`,
    );
    // A daemon outside /usr looks for /usr/bin/node; a binary that is not there is no Node.
    const missing = await noImageNode({
      daemon: { path: '/usr/lib/abx-test-no-such-node', version: process.version },
      portable: failing,
    }).catch((error: unknown) => error);
    expect((missing as Error).message).toBe(
      "sandboxes without an image have no Node to run envd on: the host has no /usr/lib/abx-test-no-such-node, and the portable runtime (the daemon's Node at /opt/abx) could not be built: patchelf is not installed. Install Node 24 (or 22, 26) as /usr/lib/abx-test-no-such-node, or fix the runtime's build (apt-get install patchelf)",
    );
  });

  test.runIf(isRoot && !hostSupported)(
    'a real sandbox whose runtime cannot be built runs the host’s Node, and its log says why',
    async () => {
      // A cache folder that cannot be made (below a file): the runtime's build fails.
      const provider = new LocalProvider({
        runtimeDir: join(ROOT, 'dist', 'runtime'),
        runtimeCacheDir: '/proc/version/abx-runtime',
      });
      const dir = mkdtempSync(join(tmpdir(), 'abx-node-fallback-'));
      const accessToken = randomBytes(16).toString('hex');
      const handle = await provider.create({
        id: `node-fallback-${randomBytes(4).toString('hex')}`,
        accessToken,
        dir,
        env: {},
        workdir: '/home/user',
        resources: {},
        network: 'none',
      });
      try {
        const { body } = await envdRequest<{ node?: string }>(
          handle.envdSocket,
          accessToken,
          'GET',
          '/info',
          undefined,
          10_000,
        );
        expect(body.node).toBe(hostVersion);
        expect(readFileSync(join(dir, 'sandbox.log'), 'utf8')).toContain(
          `abx: warning: envd runs on ${HOST_NODE} ${hostVersion}: the host's ${HOST_NODE} is ${hostVersion}, not a supported line (^22.13 || ^24 || ^26), and the portable runtime could not be built, so the host's runs anyway (`,
        );
        expect((await provider.sandboxNode(false)).version).toBe(hostVersion);
      } finally {
        await provider.kill(handle);
        await provider.close?.();
        rmSync(dir, { recursive: true, force: true });
      }
    },
    120_000,
  );
});
