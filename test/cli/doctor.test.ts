import { execFileSync } from 'node:child_process';
import { randomInt } from 'node:crypto';
import {
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmdirSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { probe } from '../../src/cli/doctor-probe.js';
import { processStartTime } from '../../src/providers/local/proc.js';
import { uidProcesses } from '../../src/providers/local/sandbox-uids.js';
import { ensureBuilt } from '../helpers/build.js';
import { type AbxResult, CLI, inPty, runProgram, sh } from './abx.js';

const isRoot = process.getuid?.() === 0;
const HOST_NODE_VERSION = execFileSync('/usr/bin/node', ['--version'], { encoding: 'utf8' }).trim();
const hasBwrap = existsSync('/usr/bin/bwrap');
const engineAnswers = (() => {
  try {
    execFileSync('docker', ['info'], { stdio: 'ignore', timeout: 10_000 });
    return true;
  } catch {
    return false;
  }
})();

const scratch = mkdtempSync(join(tmpdir(), 'abx-doctor-test-'));
/** An address where no Docker engine listens. */
const NO_ENGINE = `unix://${join(scratch, 'no-engine.sock')}`;

beforeAll(() => {
  ensureBuilt();
});

afterAll(() => {
  rmSync(scratch, { recursive: true, force: true });
});

/** `abx doctor ARGS` as this (root) test process, in a clean environment with a private HOME. */
function doctor(args: string[], env: Record<string, string> = {}): Promise<AbxResult> {
  const home = mkdtempSync(join(scratch, 'home-'));
  return runProgram(process.execPath, [CLI, 'doctor', ...args], {
    inheritEnv: false,
    env: { HOME: home, ABX_HOME: join(home, '.abx'), NO_COLOR: '1', ...env },
  });
}

/** The line of one check: `status  name  found`. */
function line(stdout: string, name: string): string {
  return stdout.split('\n').find((l) => new RegExp(`^\\S+ +${name} {2,}`).test(l)) ?? '';
}

/** The `fix:` line printed under a check's line. */
function fixOf(stdout: string, name: string): string {
  const lines = stdout.split('\n');
  const at = lines.findIndex((l) => new RegExp(`^\\S+ +${name} {2,}`).test(l));
  const next = lines[at + 1] ?? '';
  return at >= 0 && /^ +fix: /.test(next) ? next.trim() : '';
}

describe.skipIf(!hasBwrap)('abx doctor: the local provider', () => {
  test.skipIf(!isRoot)(
    'as root: root mode, bubblewrap with its version, a real sandbox start, disk images; exit 0; an engine that does not answer only warns',
    async () => {
      const { code, stdout, stderr } = await doctor([], { DOCKER_HOST: NO_ENGINE });
      expect(stderr).toBe('');
      expect(stdout).toContain(
        'abx doctor: local provider (bubblewrap), root mode (each sandbox runs as a host uid of its own)',
      );
      expect(line(stdout, 'bubblewrap')).toMatch(
        /^ok +bubblewrap +bubblewrap \d+\.\d+\.\d+ at \/usr\/bin\/bwrap$/,
      );
      expect(line(stdout, 'user namespaces')).toMatch(/^ok .* made one as sandbox uid \d+/);
      expect(line(stdout, 'sandbox start')).toMatch(
        /^ok .* bwrap ran a process as sandbox uid \d+ in new user, pid, ipc, uts and net namespaces/,
      );
      expect(line(stdout, 'uid range')).toMatch(/^(ok|warning) .* 1500000000-1500999999/);
      expect(line(stdout, 'disk quotas')).toMatch(/^ok .*ext4 disk image.*loop-mounted/);
      // Which Node sandboxes get, and why: the host's when it is a supported line, else the
      // portable runtime's copy of the daemon's (test/providers/sandbox-node.test.ts has both).
      expect(line(stdout, 'node \\(sandboxes\\)')).toMatch(
        new RegExp(
          `^(ok|warning) +node \\(sandboxes\\) +sandboxes without an image: Node v\\d+\\.\\d+\\.\\d+ \\((the host's /usr|the portable runtime: the host's /usr/bin/node is ${HOST_NODE_VERSION}, not a supported line)`,
        ),
      );
      expect(line(stdout, 'node \\(sandboxes\\)')).toContain(
        `; image sandboxes: Node ${process.version} (the portable runtime: the daemon's own)`,
      );
      expect(line(stdout, 'internet network')).toMatch(
        /^ok +internet network +a namespace with nftables rules and slirp4netns started and stopped; egress from this network namespace$/,
      );
      // Optional: the engine is not there, which warns with the fix and does not fail.
      expect(line(stdout, 'docker engine')).toMatch(
        new RegExp(
          `^warning .*the Docker engine at ${join(scratch, 'no-engine.sock')} does not answer`,
        ),
      );
      expect(fixOf(stdout, 'docker engine')).toContain('point DOCKER_HOST at a running engine');
      expect(stdout).toMatch(
        /\nsandboxes can run here with the local provider \(\d+ warnings?\)\n$/,
      );
      expect(code).toBe(0);
    },
    120_000,
  );

  test.skipIf(!isRoot)(
    '--json: the report with each check’s status, whether it is required, and ready',
    async () => {
      const { code, stdout } = await doctor(['--json']);
      const report = JSON.parse(stdout) as {
        provider: string;
        mode: string;
        ready: boolean;
        checks: { name: string; status: string; required: boolean; found: string }[];
      };
      expect(report).toMatchObject({ provider: 'local', mode: 'root', ready: true });
      expect(report.checks.map((c) => c.name)).toEqual([
        'bubblewrap',
        'user namespaces',
        'sandbox start',
        'uid range',
        'cgroups',
        'disk quotas',
        'node (daemon)',
        'node (sandboxes)',
        'internet network',
        'docker engine',
        'python3 (code)',
        'chromium (browser)',
      ]);
      for (const check of report.checks) expect(['ok', 'warning']).toContain(check.status);
      expect(report.checks.find((c) => c.name === 'bubblewrap')).toMatchObject({
        status: 'ok',
        required: true,
      });
      expect(report.checks.find((c) => c.name === 'chromium (browser)')?.required).toBe(false);
      expect(code).toBe(0);
    },
    120_000,
  );

  test.skipIf(!isRoot)(
    'no bwrap where the daemon looks for it: "bubblewrap missing" with the apt-get fix, no sandbox start, exit 1',
    async () => {
      // /usr/bin without bwrap, in a mount namespace of its own: a farm of links to every other
      // program of /usr/bin (reached through a second mount of the real one) mounted over it.
      const real = join(scratch, 'usr-bin');
      const farm = join(scratch, 'farm');
      mkdirSync(real);
      mkdirSync(farm);
      for (const name of readdirSync('/usr/bin')) {
        if (name !== 'bwrap') symlinkSync(join(real, name), join(farm, name));
      }
      const home = mkdtempSync(join(scratch, 'home-'));
      const { code, stdout } = await runProgram(
        'unshare',
        [
          '--mount',
          '--propagation',
          'private',
          '--',
          '/bin/sh',
          '-c',
          'mount --bind /usr/bin "$1" && mount --bind "$2" /usr/bin && shift 2 && exec "$@"',
          'hide-bwrap',
          real,
          farm,
          process.execPath,
          CLI,
          'doctor',
        ],
        { inheritEnv: false, env: { HOME: home, NO_COLOR: '1', DOCKER_HOST: NO_ENGINE } },
      );
      expect(line(stdout, 'bubblewrap')).toBe(
        'missing  bubblewrap          no bwrap in /usr/sbin:/usr/bin:/sbin:/bin (where the daemon looks for it)',
      );
      expect(fixOf(stdout, 'bubblewrap')).toBe(
        'fix: apt-get install bubblewrap (Fedora: dnf install bubblewrap)',
      );
      expect(line(stdout, 'sandbox start')).toBe('');
      expect(stdout).toContain('sandboxes cannot run here with the local provider: fix bubblewrap');
      expect(code).toBe(1);
    },
    120_000,
  );

  describe.skipIf(!isRoot)('as an unprivileged user (rootless)', () => {
    const uid = 1_400_000_000 + randomInt(1_000_000);
    const cgroups: string[] = [];
    let home: string;

    beforeAll(() => {
      home = mkdtempSync(join(tmpdir(), 'abx-doctor-rootless-'));
      chownSync(home, uid, uid);
    });

    afterAll(async () => {
      for (let i = 0; i < 100 && uidProcesses(uid).length > 0; i++) {
        for (const pid of uidProcesses(uid)) {
          try {
            process.kill(pid, 'SIGKILL');
          } catch {
            // gone
          }
        }
        await new Promise((r) => setTimeout(r, 20));
      }
      for (const dir of cgroups) {
        for (const child of existsSync(dir) ? readdirSync(dir, { withFileTypes: true }) : []) {
          if (child.isDirectory()) rmdirSync(join(dir, child.name));
        }
        if (existsSync(dir)) rmdirSync(dir);
      }
      rmSync(home, { recursive: true, force: true });
    });

    const asUser = (
      args: string[] = [],
      env: Record<string, string> = { DOCKER_HOST: NO_ENGINE },
    ) =>
      runProgram(
        'setpriv',
        [
          `--reuid=${uid}`,
          `--regid=${uid}`,
          '--clear-groups',
          '--',
          process.execPath,
          CLI,
          'doctor',
          ...args,
        ],
        {
          inheritEnv: false,
          env: { HOME: home, ABX_HOME: join(home, '.abx'), NO_COLOR: '1', ...env },
        },
      );

    test('rootless mode: bubblewrap, a user namespace and a sandbox start as this uid; no delegated cgroup is a warning with the delegation; exit 0', async () => {
      const { code, stdout, stderr } = await asUser();
      expect(stderr).toBe('');
      expect(stdout).toContain(
        'abx doctor: local provider (bubblewrap), rootless mode (sandboxes run as the daemon’s uid)',
      );
      expect(line(stdout, 'bubblewrap')).toMatch(/^ok +bubblewrap +bubblewrap \d+\.\d+\.\d+ at /);
      expect(line(stdout, 'user namespaces')).toContain(`ok`);
      expect(line(stdout, 'user namespaces')).toContain(`made one as this user (uid ${uid})`);
      expect(line(stdout, 'sandbox start')).toMatch(/^ok .* as this user in new user, pid/);
      expect(line(stdout, 'uid range')).toContain(
        `not used: rootless sandboxes run as this user's uid ${uid}`,
      );
      expect(line(stdout, 'cgroups')).toMatch(/^warning .*limits are not enforced/);
      expect(fixOf(stdout, 'cgroups')).toContain(`abx-${uid}`);
      expect(line(stdout, 'disk quotas')).toMatch(/^warning .*tmpfs/);
      expect(line(stdout, 'internet network')).toMatch(/^ok .*slirp4netns started and stopped/);
      // An egress namespace this user cannot enter is named, with what to do; only a warning.
      const elsewhere = await asUser([], {
        DOCKER_HOST: NO_ENGINE,
        ABX_EGRESS_NETNS: '/run/netns/abx-doctor-no-such-namespace',
      });
      expect(line(elsewhere.stdout, 'internet network')).toMatch(
        /^warning +internet network +the egress namespace \/run\/netns\/abx-doctor-no-such-namespace does not exist: templates that name no network run offline/,
      );
      expect(elsewhere.code).toBe(0);
      expect(stdout).toMatch(
        /\nsandboxes can run here with the local provider \(\d+ warnings\)\n$/,
      );
      expect(code).toBe(0);
    }, 120_000);

    test.skipIf(!engineAnswers || process.env.DOCKER_HOST !== undefined)(
      '--provider docker: the engine’s socket refuses this user: the fix is the docker group, not starting an engine; exit 1',
      async () => {
        const { code, stdout } = await asUser(['--provider', 'docker'], {});
        expect(line(stdout, 'docker engine')).toMatch(
          /^failed +docker engine +cannot use Docker: the Docker engine at \/var\/run\/docker\.sock refused this user .*\(EACCES\)$/,
        );
        expect(fixOf(stdout, 'docker engine')).toBe(
          `fix: add this user to the docker group (usermod -aG docker ${uid}, then log in again), or run it as root`,
        );
        expect(code).toBe(1);
      },
      120_000,
    );

    test.skipIf(!existsSync('/sys/fs/cgroup/pids/cgroup.procs'))(
      'with the cgroups the fix delegates, the cgroups line is ok',
      async () => {
        for (const controller of ['memory', 'pids', 'cpu']) {
          const dir = `/sys/fs/cgroup/${controller}/abx-${uid}`;
          mkdirSync(dir);
          cgroups.push(dir);
          chownSync(dir, uid, uid);
          chownSync(join(dir, 'cgroup.procs'), uid, uid);
        }
        const { code, stdout } = await asUser();
        expect(line(stdout, 'cgroups')).toBe(
          `ok       cgroups             v1; memory, cpu, pids writable under abx-${uid}/`,
        );
        expect(code).toBe(0);
      },
      120_000,
    );
  });

  test.skipIf(!isRoot)(
    'on a terminal: symbols and colour; NO_COLOR: the status words',
    async () => {
      const home = mkdtempSync(join(scratch, 'home-'));
      const base = `HOME=${sh(home)} DOCKER_HOST=${sh(NO_ENGINE)} ${sh(process.execPath)} ${sh(CLI)} doctor`;
      const coloured = await inPty(`env -u NO_COLOR ${base}`);
      expect(coloured.screen).toContain('\u001b[32m✓\u001b[39m bubblewrap');
      expect(coloured.screen).toContain('\u001b[33m!\u001b[39m docker engine');
      const plain = await inPty(`NO_COLOR=1 ${base}`);
      expect(plain.screen).not.toContain('\u001b[');
      expect(plain.screen).toMatch(/\nok +bubblewrap/);
    },
    120_000,
  );
});

describe('abx doctor --provider docker', () => {
  test('DOCKER_HOST at a socket nobody listens on: the engine line says so, with the fix; exit 1', async () => {
    const { code, stdout } = await doctor(['--provider', 'docker'], { DOCKER_HOST: NO_ENGINE });
    expect(stdout).toContain('abx doctor: docker provider\n');
    expect(line(stdout, 'docker engine')).toMatch(
      new RegExp(
        `^failed +docker engine +cannot use Docker: the Docker engine at ${join(scratch, 'no-engine.sock')} does not answer \\(ENOENT\\)$`,
      ),
    );
    expect(fixOf(stdout, 'docker engine')).toContain('point DOCKER_HOST at a running engine');
    expect(stdout).toContain(
      'sandboxes cannot run here with the docker provider: fix docker engine',
    );
    expect(code).toBe(1);
  }, 60_000);

  test.skipIf(!engineAnswers || !isRoot)(
    'the engine of this machine: its version, root or rootless, and the portable runtime injected into sandboxes; exit 0',
    async () => {
      const { code, stdout } = await doctor(
        ['--provider', 'docker'],
        process.env.DOCKER_HOST ? { DOCKER_HOST: process.env.DOCKER_HOST } : {},
      );
      expect(line(stdout, 'docker engine')).toMatch(
        /^ok +docker engine +Docker \S+ at \S+, (run as root|a rootless engine)/,
      );
      expect(line(stdout, 'portable runtime')).toMatch(
        new RegExp(
          `^ok .*Node ${process.version} with \\d+ libraries, \\d+ MB at /run/abx-runtime/portable-\\S+ \\((built now|cached)\\); bound read-only at /opt/abx in a container of an image with no files \\((abx-doctor-probe:[0-9a-f]{12}), removed\\), its Node ran \\(${process.version}\\)$`,
        ),
      );
      // This run's probe image and container are gone (another doctor's may be up meanwhile).
      const probeImage = /\((abx-doctor-probe:[0-9a-f]{12}), removed\)/.exec(stdout)?.[1] ?? '';
      const left = execFileSync(
        'docker',
        ['ps', '-a', '--filter', `label=abx.doctor.image=${probeImage}`, '-q'],
        { encoding: 'utf8' },
      );
      expect(left.trim()).toBe('');
      const images = execFileSync('docker', ['images', probeImage, '-q'], {
        encoding: 'utf8',
      });
      expect(images.trim()).toBe('');
      expect(code).toBe(0);
    },
    240_000,
  );
});

describe('abx doctor --provider kubernetes', () => {
  test('KUBECONFIG names a missing file and this is no pod: "no kubeconfig found" and how to point at one; exit 1', async () => {
    const missing = join(scratch, 'no-such-kubeconfig');
    const { code, stdout } = await doctor(['--provider', 'kubernetes'], { KUBECONFIG: missing });
    expect(stdout).toContain(
      `problem: no kubeconfig found: KUBECONFIG names ${missing}, which does not exist; set KUBECONFIG to a kubeconfig file (abx doctor also takes --kubeconfig)`,
    );
    expect(stdout).not.toMatch(/TLS|localhost:8080/);
    expect(code).toBe(1);
  }, 60_000);

  test('no KUBECONFIG, no ~/.kube/config, no service account: names the three places; --json keeps the cluster report shape', async () => {
    const { code, stdout } = await doctor(['--provider', 'kubernetes', '--json']);
    const report = JSON.parse(stdout) as { reachable: boolean; problems: string[] };
    expect(report.reachable).toBe(false);
    expect(report.problems).toHaveLength(1);
    expect(report.problems[0]).toMatch(
      /^no kubeconfig found \(KUBECONFIG, ~\/\.kube\/config, in-cluster\): KUBECONFIG is not set, .*\/\.kube\/config does not exist/,
    );
    expect(code).toBe(1);
  }, 60_000);

  test('a kubernetes daemon with no kubeconfig refuses to start with the same message, not a TLS-option error', async () => {
    const home = mkdtempSync(join(scratch, 'home-'));
    const { code, stderr } = await runProgram(process.execPath, [join(CLI, '..', 'daemon.js')], {
      inheritEnv: false,
      env: { HOME: home, ABX_HOME: join(home, '.abx'), ABX_PROVIDER: 'kubernetes' },
    });
    expect(stderr).toContain(
      'abx daemon: no kubeconfig found (KUBECONFIG, ~/.kube/config, in-cluster): KUBECONFIG is not set',
    );
    expect(stderr).not.toMatch(/TLS|skipTLSVerify/);
    expect(code).toBe(1);
  }, 60_000);
});

describe('doctor probes', () => {
  test('a probe past its timeout answers as timed out, and its whole process group is killed, even a child that holds its output open', async () => {
    const result = await probe('/bin/sh', ['-c', 'sleep 300 & echo $!; sleep 300'], {
      timeoutMs: 1000,
    });
    expect(result).toMatchObject({ ok: false, timedOut: true, code: null });
    const child = Number(result.stdout.trim());
    expect(child).toBeGreaterThan(0);
    // Gone, or a zombie waiting for the host's init to reap it: either way it runs no more.
    for (let i = 0; i < 250 && processStartTime(child); i++) {
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(processStartTime(child)).toBeUndefined();
  }, 30_000);
});
