// `--only egress` (bench/README.md).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox, Secret, Template, Templates } from 'abx-sandbox';
import {
  internetUnavailable,
  makeInternet,
  type TestInternet,
} from '../../test/helpers/internet.js';
import { childMentioning, cpuMs, sandboxNetProcesses } from '../measure.js';
import { log, ROOT, results, row, scale } from '../runner.js';
import { median, round } from '../stats.js';

/**
 * Egress (issue 28): a 100 MiB download from inside an `internet` sandbox, through egress, as a
 * share of the same download made straight from the egress namespace (`ip netns exec`), to the
 * same server of the tests' stand-in internet (test/helpers/internet.ts: a network namespace
 * with TEST-NET servers and no route out). Three ways: HTTP on port 80 (egress's HTTP proxy, by
 * the Host header), HTTPS on 443 (its TLS passthrough, by the SNI) and plain TCP to port 8080
 * (no proxy: slirp4netns alone, the address opened by egress's DNS), each timed by curl's
 * `time_total`, interleaved, the median of several. The CPU time of the egress service and of
 * the sandbox's slirp4netns over the timed downloads says where the time goes. Its own daemon
 * (`ABX_EGRESS_NETNS` the stand-in internet) and `$ABX_HOME`; needs root.
 */
export async function egress() {
  const unavailable = internetUnavailable();
  if (unavailable) {
    row('13 egress', 'skipped', '—', `needs root and a test internet: ${unavailable}`);
    results.egress = { skipped: unavailable };
    return;
  }
  log('egress: a stand-in internet, a daemon on it, an internet sandbox');
  const home = mkdtempSync(join(tmpdir(), 'abx-bench-egress-'));
  let internet: TestInternet | undefined;
  const ids: string[] = [];
  const cli = (...args: string[]) =>
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), ...args], {
      encoding: 'utf8',
      env: {
        ...process.env,
        ABX_HOME: home,
        // One sandbox: no pooled ones holding namespaces beside it.
        ABX_WARM_POOL: '0',
        ...(internet
          ? {
              ABX_EGRESS_NETNS: internet.path,
              ABX_EGRESS_HOSTS: internet.hostsFile,
              // Egress verifies the origins it opens TLS to itself (a host with header rules).
              NODE_EXTRA_CA_CERTS: internet.caCert,
            }
          : {}),
      },
    });
  // Also on Ctrl-C or a kill: sandboxes, their network processes, the daemon, the namespace.
  const cleanUp = () => {
    for (const id of ids) cli('kill', id);
    cli('daemon', 'stop');
    for (const pid of ids.flatMap(sandboxNetProcesses)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    internet?.remove();
    rmSync(home, { recursive: true, force: true });
  };
  const onSignal = (signal: NodeJS.Signals) => {
    cleanUp();
    process.kill(process.pid, signal);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    internet = await makeInternet();
    const started = cli('daemon', 'start');
    if (started.status !== 0) {
      throw new Error(
        `abx daemon start (egress bench) exited ${started.status}: ${started.stderr}`,
      );
    }
    await Templates.build(
      Template.fromBase().setNetwork('internet', {
        allowOut: ['allowed.test'],
        denyOut: ['0.0.0.0/0'],
      }),
      { name: 'egress', home },
    );
    const box = await Sandbox.create({ template: 'egress', home });
    ids.push(box.sandboxId);
    await box.files.write('/tmp/ca.pem', readFileSync(internet.caCert, 'utf8'));
    // www.allowed.test (the same server) has a header rule with a secret: egress terminates its
    // TLS and opens its own; allowed.test stays passthrough by SNI.
    await Secret.create('bench-token', 'bench-secret-value', { home });
    await box.setNetwork({
      allowOut: ['allowed.test', 'www.allowed.test'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'www.allowed.test': [
          // biome-ignore lint/suspicious/noTemplateCurlyInString: abx's placeholder, sent as text
          { transform: { headers: { Authorization: 'Bearer ${secrets.bench-token}' } } },
        ],
      },
    });
    const daemonPid = (
      JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as { pid: number }
    ).pid;
    const egressPid = childMentioning(daemonPid, 'egress.js');
    const slirpPid = sandboxNetProcesses(box.sandboxId).find((pid) =>
      readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('slirp4netns'),
    );
    const size = 100 * 1024 * 1024;
    const rounds = scale(5, 3);
    const format = '%{http_code} %{size_download} %{time_total}';
    const seconds = (how: string, out: string) => {
      const [code, bytes, total] = out.trim().split(' ');
      if (code !== '200' || Number(bytes) !== size) {
        throw new Error(`egress bench: ${how} got HTTP ${code} and ${bytes} of ${size} bytes`);
      }
      return Number(total);
    };
    const { ns, caCert, addresses } = internet;
    const ways = {
      http: { port: 80, url: `http://allowed.test/bytes/${size}`, tls: false },
      https: { port: 443, url: `https://allowed.test/bytes/${size}`, tls: true },
      httpsRule: { port: 443, url: `https://www.allowed.test/bytes/${size}`, tls: true },
      tcp: { port: 8080, url: `http://allowed.test:8080/bytes/${size}`, tls: false },
    };
    type Way = keyof typeof ways;
    const straight = (way: Way) => {
      const { port, url, tls } = ways[way];
      const run = spawnSync(
        'ip',
        [
          ...['netns', 'exec', ns, 'curl', '-sS', '--max-time', '120', '-o', '/dev/null'],
          ...['-w', format, '--resolve', `${new URL(url).hostname}:${port}:${addresses.allowed}`],
          ...(tls ? ['--cacert', caCert] : []),
          url,
        ],
        { encoding: 'utf8' },
      );
      if (run.status !== 0) throw new Error(`egress bench: straight ${way}: ${run.stderr}`);
      return seconds(`straight ${way}`, run.stdout);
    };
    const through = async (way: Way) => {
      const { url, tls } = ways[way];
      // A host with rules is shown egress's certificate (the sandbox's bundle trusts its CA).
      const ca = way === 'httpsRule' ? '' : tls ? '--cacert /tmp/ca.pem ' : '';
      const { stdout } = await box.commands.run(
        `curl -sS --max-time 120 -o /dev/null -w '${format}' ${ca}${url}`,
        { timeoutMs: 180_000 },
      );
      return seconds(`${way} through egress`, stdout);
    };
    const samples = Object.fromEntries(
      Object.keys(ways).map((way) => [way, { straight: [] as number[], through: [] as number[] }]),
    ) as Record<Way, { straight: number[]; through: number[] }>;
    const cpu = Object.fromEntries(
      Object.keys(ways).map((way) => [way, { egress: 0, slirp: 0 }]),
    ) as Record<Way, { egress: number; slirp: number }>;
    // A first round untimed (the egress service's JIT, the page cache), then interleaved rounds.
    for (let pass = 0; pass <= rounds; pass++) {
      for (const way of Object.keys(ways) as Way[]) {
        const straightSeconds = straight(way);
        const before = [cpuMs(egressPid), cpuMs(slirpPid)];
        const throughSeconds = await through(way);
        if (pass === 0) continue;
        cpu[way].egress += cpuMs(egressPid) - (before[0] as number);
        cpu[way].slirp += cpuMs(slirpPid) - (before[1] as number);
        samples[way].straight.push(straightSeconds);
        samples[way].through.push(throughSeconds);
      }
    }
    const mib = size / 1024 / 1024;
    const figures: Record<string, unknown> = { mib, rounds };
    const labels: Record<Way, string> = {
      http: 'HTTP (port 80: egress HTTP proxy)',
      https: 'HTTPS (443: egress TLS passthrough by SNI)',
      httpsRule: 'HTTPS to a host with a header rule (443: TLS terminated, a secret set)',
      tcp: 'TCP to port 8080 (no proxy: slirp4netns alone)',
    };
    for (const way of Object.keys(ways) as Way[]) {
      const straightMiBps = round(mib / median(samples[way].straight), 1);
      const throughMiBps = round(mib / median(samples[way].through), 1);
      const sharePct = round((100 * throughMiBps) / straightMiBps, 1);
      const perRun = (ms: number) => round(ms / rounds, 0);
      figures[way] = {
        straightSeconds: samples[way].straight,
        throughSeconds: samples[way].through,
        straightMiBps,
        throughMiBps,
        sharePct,
        egressCpuMsPerDownload: perRun(cpu[way].egress),
        slirpCpuMsPerDownload: perRun(cpu[way].slirp),
      };
      row(
        '13 egress',
        `${mib} MiB ${labels[way]}: straight / through egress`,
        `${straightMiBps} / ${throughMiBps} MiB/s`,
        `${sharePct}% of straight (median of ${rounds}); CPU per download: egress service ${perRun(cpu[way].egress)} ms, slirp4netns ${perRun(cpu[way].slirp)} ms`,
      );
    }
    figures.requests = await ruleRequests(box, rounds);
    results.egress = figures;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    cleanUp();
  }
}

/**
 * Small HTTPS requests from inside the sandbox, each on a new connection (a handshake each), to a
 * host with a header rule (egress terminates TLS, resolves the secret, opens its own TLS) and to
 * one passed through by SNI, interleaved: the medians and their ratio.
 */
async function ruleRequests(box: Sandbox, rounds: number) {
  const count = scale(40, 15);
  const script = `
const https = require('node:https'), fs = require('node:fs');
const ca = [fs.readFileSync('/tmp/ca.pem'), fs.readFileSync('/run/abx/egress-ca.pem')];
const get = (host) => new Promise((ok, fail) => {
  const t = process.hrtime.bigint();
  https.get({ host, path: '/headers', agent: false, ca }, (r) => {
    let body = ''; r.on('data', (c) => (body += c));
    r.on('end', () => ok([Number(process.hrtime.bigint() - t) / 1e6, JSON.parse(body).authorization]));
  }).on('error', fail);
});
(async () => {
  const out = { rule: [], passthrough: [], header: undefined };
  for (let i = 0; i < ${count}; i++) {
    const [a, header] = await get('www.allowed.test'); out.rule.push(a); out.header = header;
    out.passthrough.push((await get('allowed.test'))[0]);
  }
  console.log(JSON.stringify(out));
})();`;
  const medians = { rule: [] as number[], passthrough: [] as number[] };
  for (let pass = 0; pass <= rounds; pass++) {
    await box.files.write('/tmp/rule-requests.cjs', script);
    const { stdout } = await box.commands.run('node /tmp/rule-requests.cjs', {
      timeoutMs: 120_000,
    });
    const out = JSON.parse(stdout) as { rule: number[]; passthrough: number[]; header?: string };
    if (out.header !== 'Bearer bench-secret-value') {
      throw new Error(`egress bench: the rule's header did not arrive (${out.header})`);
    }
    if (pass === 0) continue;
    medians.rule.push(median(out.rule));
    medians.passthrough.push(median(out.passthrough));
  }
  const ruleMs = round(median(medians.rule), 2);
  const passthroughMs = round(median(medians.passthrough), 2);
  const ratio = round(ruleMs / passthroughMs, 2);
  row(
    '13 egress',
    'HTTPS request on a new connection: header rule (TLS terminated) / passthrough',
    `${ruleMs} / ${passthroughMs} ms`,
    `${ratio}× (median of ${rounds} runs of ${count} interleaved requests each)`,
  );
  return { count, ruleMs, passthroughMs, ratio };
}
