import { resolve } from 'node:path';
import { type Command, InvalidArgumentError } from 'commander';
import type { SandboxInfo, SandboxState } from '../../runtime/protocol/wire.js';
import {
  createSandbox,
  type EgressProxy,
  forkSandbox,
  getSandboxInfo,
  getSandboxMetrics,
  getSandboxNetwork,
  killSandbox,
  listSandboxes,
  openControl,
  pauseSandbox,
  resumeSandbox,
  type SandboxMetric,
  setSandboxNetwork,
  setSandboxTimeout,
  snapshotSandbox,
  type VolumeMountRequest,
  type WorkspaceRequest,
} from '../sandbox/sandbox-api.js';
import { UsageError } from './errors.js';
import { formatBytes, withSpinner } from './feedback.js';
import { collectPairs, lifetimeArg, withExamples } from './options.js';
import {
  ago,
  type Cell,
  printFields,
  printJson,
  printLine,
  printTable,
  relative,
} from './output.js';
import type { Colour } from './style.js';

const STATE_COLOURS: Record<string, Colour> = {
  running: 'green',
  paused: 'cyan',
  killed: 'dim',
  expired: 'yellow',
  dead: 'red',
};

function stateCell(state: SandboxInfo['state']): Cell {
  const colour = STATE_COLOURS[state];
  return colour ? { text: state, colour } : state;
}

function printInfo(info: SandboxInfo): void {
  const ended = info.endedAt
    ? [['ended', `${ago(info.endedAt)} (${info.endReason})`] as const]
    : [];
  printFields([
    ['id', info.sandboxId],
    ['template', info.template],
    ['state', info.paused ? `paused (${pausedText(info.paused)})` : info.state],
    ['created', `${info.createdAt} (${ago(info.createdAt)})`],
    [
      info.paused ? 'removed' : 'expires',
      info.state === 'running' || info.paused
        ? `${info.expiresAt} (${relative(info.expiresAt)})`
        : '-',
    ],
    ...(info.lifecycle.onTimeout === 'pause'
      ? ([
          [
            'on timeout',
            `pause (${info.lifecycle.keepMemory ? 'freeze, memory kept' : 'hibernate, disk kept'})${info.lifecycle.autoResume ? '; its traffic resumes it' : ''}`,
          ],
        ] as const)
      : []),
    ...ended,
    ['capabilities', info.capabilities.join(', ') || '-'],
    ...(info.network ? ([['network', networkText(info.network)]] as const) : []),
    ...((info.volumeMounts ?? []).length > 0
      ? ([
          [
            'volumes',
            info.volumeMounts
              .map((m) => `${m.name} at ${m.path}${m.readOnly ? ' (read-only)' : ''}`)
              .join(', '),
          ],
        ] as const)
      : []),
    [
      'metadata',
      Object.entries(info.metadata)
        .map(([k, v]) => `${k}=${v}`)
        .join(' ') || '-',
    ],
  ]);
}

/** How a paused sandbox is kept, and since when: `frozen 5 min ago`. */
function pausedText(paused: NonNullable<SandboxInfo['paused']>): string {
  return `${paused.memory ? 'frozen, memory kept' : 'hibernated, disk kept'}, ${ago(paused.pausedAt)}`;
}

/** An internet sandbox's policy in one line: `internet: allow a, b; deny c; via socks5://u@h:p`. */
function networkText(policy: {
  allowOut: string[];
  denyOut: string[];
  egressProxy?: Omit<EgressProxy, 'password'>;
}): string {
  const proxy = policy.egressProxy;
  const parts = [
    policy.allowOut.length > 0 ? `allow ${policy.allowOut.join(', ')}` : '',
    policy.denyOut.length > 0 ? `deny ${policy.denyOut.join(', ')}` : '',
  ].filter(Boolean);
  const lists = `internet${parts.length > 0 ? `: ${parts.join('; ')}` : ' (no lists: every public address)'}`;
  if (!proxy) return lists;
  const user = proxy.username === undefined ? '' : `${encodeURIComponent(proxy.username)}@`;
  return `${lists}; through socks5://${user}${proxy.address}`;
}

/** Where the password of `--egress-proxy` is read from: argv is readable by every local user. */
const EGRESS_PROXY_PASSWORD_ENV = 'ABX_EGRESS_PROXY_PASSWORD';

/**
 * `--egress-proxy socks5://[user@]host:port`: the user's SOCKS5 proxy. The password comes from
 * ABX_EGRESS_PROXY_PASSWORD, never the URL; the daemon checks the rest.
 */
function egressProxyArg(value: string): EgressProxy {
  const match = /^socks5h?:\/\/(?:([^@/]*)@)?([^@/]+)\/?$/i.exec(value.trim());
  if (!match) {
    throw new InvalidArgumentError(
      `expected socks5://host:port or socks5://user@host:port, not '${value}'.`,
    );
  }
  if (match[1]?.includes(':')) {
    throw new InvalidArgumentError(
      `give the proxy's password in ${EGRESS_PROXY_PASSWORD_ENV}, not in the URL (any local user can read a command line).`,
    );
  }
  const username = match[1] ? decodeURIComponent(match[1]) : undefined;
  return { address: match[2] as string, ...(username === undefined ? {} : { username }) };
}

/** The proxy of `--egress-proxy`, with the password from the environment when it is set. */
function withPassword(proxy: EgressProxy): EgressProxy {
  const password = process.env[EGRESS_PROXY_PASSWORD_ENV];
  return password ? { ...proxy, password } : proxy;
}

/** `--allow a --allow b,c`: entries, repeatable or comma-separated. */
function collectEntries(value: string, previous: string[] = []): string[] {
  return [
    ...previous,
    ...value
      .split(',')
      .map((e) => e.trim())
      .filter(Boolean),
  ];
}

interface CreateOptions {
  template?: string;
  timeout?: number;
  env?: Record<string, string>;
  meta?: Record<string, string>;
  allow?: string[];
  deny?: string[];
  egressProxy?: EgressProxy;
  internet?: boolean;
  autoPause?: boolean;
  hibernate?: boolean;
  autoResume?: boolean;
  volume?: VolumeMountRequest[];
  workspace?: WorkspaceRequest;
  upload?: boolean;
  gitignore?: boolean;
  quiet?: boolean;
  json?: boolean;
}

/**
 * `--workspace DIR[:PATH]`: a host folder (relative to the working directory) mounted
 * copy-on-write at PATH (default: the home's `workspace`).
 */
function workspaceArg(value: string): WorkspaceRequest {
  const at = value.indexOf(':/');
  const from = at < 0 ? value : value.slice(0, at);
  if (from === '') {
    throw new InvalidArgumentError('expected a folder, such as ./repo or ./repo:/home/user/repo.');
  }
  return { from: resolve(from), ...(at < 0 ? {} : { path: value.slice(at + 1) }) };
}

/** `--volume NAME:PATH[:ro]` (repeatable): a volume to mount. */
function collectVolumes(value: string, previous: VolumeMountRequest[] = []): VolumeMountRequest[] {
  const match = /^([^:]+):(\/[^:]*)(?::(ro|rw))?$/.exec(value);
  if (!match) {
    throw new InvalidArgumentError(
      `expected NAME:PATH or NAME:PATH:ro (a volume and an absolute path such as data:/mnt/data), not '${value}'.`,
    );
  }
  return [
    ...previous,
    {
      name: match[1] as string,
      path: match[2] as string,
      ...(match[3] === 'ro' ? { readOnly: true } : {}),
    },
  ];
}

/** `--upload`: the folder is packed here and sent to the daemon (docs/workspaces.md, "From a remote client"). */
async function uploadedWorkspace(
  connection: Awaited<ReturnType<typeof openControl>>['connection'],
  options: CreateOptions,
): Promise<{ upload: string; path?: string } | WorkspaceRequest | undefined> {
  const { workspace } = options;
  if (!options.upload) {
    if (options.gitignore) {
      throw new InvalidArgumentError('--gitignore goes with --upload (--workspace DIR --upload).');
    }
    return workspace;
  }
  if (!workspace)
    throw new InvalidArgumentError('--upload needs --workspace DIR: the folder to send.');
  const { daemonClient } = await import('../sandbox/http-client.js');
  const { UPLOAD_TIMEOUT_MS, uploadFolder } = await import('../sandbox/workspace-upload.js');
  const sent = await uploadFolder(
    daemonClient(connection, UPLOAD_TIMEOUT_MS),
    workspace.from,
    options.gitignore === true,
  );
  return { upload: sent.uploadId, ...(workspace.path ? { path: workspace.path } : {}) };
}

async function create(options: CreateOptions): Promise<void> {
  const { client, connection } = await openControl();
  const workspace = options.upload
    ? await withSpinner(`uploading ${options.workspace?.from ?? 'the workspace'}`, () =>
        uploadedWorkspace(connection, options),
      )
    : await uploadedWorkspace(connection, options);
  const info = await withSpinner(`creating a sandbox from ${options.template ?? 'base'}`, () =>
    createSandbox(client, {
      ...(options.template ? { template: options.template } : {}),
      ...(options.timeout ? { timeoutMs: options.timeout } : {}),
      ...(options.env ? { envs: options.env } : {}),
      ...(options.meta ? { metadata: options.meta } : {}),
      ...(options.allow || options.deny || options.egressProxy
        ? {
            network: {
              allowOut: options.allow ?? [],
              denyOut: options.deny ?? [],
              ...(options.egressProxy ? { egressProxy: withPassword(options.egressProxy) } : {}),
            },
          }
        : {}),
      ...(options.internet === undefined ? {} : { allowInternetAccess: options.internet }),
      ...(options.autoPause ? { autoPause: true } : {}),
      ...(options.autoPause && options.hibernate ? { autoPauseMemory: false } : {}),
      ...(options.autoResume ? { autoResume: true } : {}),
      ...(options.volume ? { volumeMounts: options.volume } : {}),
      ...(workspace ? { workspace } : {}),
    }),
  );
  if (options.quiet) return printLine(info.sandboxId);
  const { accessToken: _token, gatewayUrl: _gateway, ...sandbox } = info;
  if (options.json) return printJson(sandbox);
  printLine(
    `created sandbox ${info.sandboxId} (template ${info.template}, expires ${relative(info.expiresAt)})`,
  );
}

interface ListOptions {
  all?: boolean;
  state?: SandboxState[];
  template?: string;
  meta?: Record<string, string>;
  json?: boolean;
}

const STATES: readonly SandboxState[] = [
  'running',
  'paused',
  'pooled',
  'killed',
  'expired',
  'dead',
];

/** `--state running,dead`: one state or several. */
function statesArg(value: string, previous: SandboxState[] = []): SandboxState[] {
  const states = value.split(',').filter(Boolean);
  for (const state of states) {
    if (!STATES.includes(state as SandboxState)) {
      throw new InvalidArgumentError(
        `expected one or more of ${STATES.join(', ')}, not '${state}'.`,
      );
    }
  }
  return [...previous, ...(states as SandboxState[])];
}

async function list(options: ListOptions): Promise<void> {
  const { client } = await openControl();
  const sandboxes = await listSandboxes(client, {
    ...(options.state ? { state: options.state } : options.all ? { all: true } : {}),
    ...(options.template ? { template: options.template } : {}),
    ...(options.meta ? { metadata: options.meta } : {}),
  });
  if (options.json) return printJson(sandboxes);
  printTable(
    ['ID', 'TEMPLATE', 'STATE', 'AGE', 'EXPIRES'],
    sandboxes.map((s) => [
      s.sandboxId,
      s.template,
      stateCell(s.state),
      ago(s.createdAt).replace(/ ago$/, ''),
      s.state === 'running' ? relative(s.expiresAt) : s.paused ? pausedText(s.paused) : '-',
    ]),
  );
}

async function pause(id: string, options: { hibernate?: boolean; json?: boolean }): Promise<void> {
  const { client } = await openControl();
  const info = await withSpinner(`${options.hibernate ? 'hibernating' : 'pausing'} ${id}`, () =>
    pauseSandbox(client, id, options.hibernate ? { memory: false } : {}),
  );
  if (options.json) return printJson(info);
  printLine(
    `paused ${id} (${options.hibernate ? 'hibernated: its processes ended, its disk kept' : 'frozen: its processes and memory kept'}); abx resume ${id} runs it again`,
  );
}

async function resume(id: string, options: { timeout?: number; json?: boolean }): Promise<void> {
  const { client } = await openControl();
  let info = await withSpinner(`resuming ${id}`, () =>
    resumeSandbox(client, id, options.timeout ? { timeoutMs: options.timeout } : {}),
  );
  // Something resumed it first (a request through the gateway, auto-resume): the lifetime asked
  // for still holds, from now.
  if (!info.resumed && options.timeout) {
    await setSandboxTimeout(client, id, options.timeout);
    info = { ...(await getSandboxInfo(client, id)), resumed: false };
  }
  if (options.json) return printJson(info);
  printLine(
    info.resumed
      ? `resumed ${id}; it expires ${relative(info.expiresAt)}`
      : `${id} was running already; it expires ${relative(info.expiresAt)}${options.timeout ? ' (--timeout applied)' : ''}`,
  );
}

/** Parses `--count`: a whole number of forks, 1 to 10. */
function forkCountArg(value: string): number {
  const count = Number(value);
  if (!/^\d+$/.test(value) || count < 1 || count > 10) {
    throw new InvalidArgumentError('expected a whole number of forks from 1 to 10.');
  }
  return count;
}

async function fork(
  id: string,
  options: {
    count?: number;
    timeout?: number;
    meta?: Record<string, string>;
    quiet?: boolean;
    json?: boolean;
  },
): Promise<void> {
  const { client } = await openControl();
  const count = options.count ?? 1;
  const forks = await withSpinner(`forking ${id}${count > 1 ? ` ${count} times` : ''}`, () =>
    forkSandbox(client, id, {
      count,
      ...(options.timeout ? { timeoutMs: options.timeout } : {}),
      ...(options.meta ? { metadata: options.meta } : {}),
    }),
  );
  const infos = forks.map(({ accessToken: _token, gatewayUrl: _gateway, ...info }) => info);
  if (options.json) return printJson(infos);
  for (const info of infos) {
    printLine(
      options.quiet
        ? info.sandboxId
        : `forked ${id} as ${info.sandboxId} (expires ${relative(info.expiresAt)})`,
    );
  }
}

async function kill(ids: string[], options: { all?: boolean; json?: boolean }): Promise<void> {
  if (options.all && ids.length > 0)
    throw new UsageError('give sandbox ids or --all, not both', 'abx kill --help');
  if (!options.all && ids.length === 0)
    throw new UsageError('give the ids of the sandboxes to kill, or --all', 'abx kill --help');
  const { client } = await openControl();
  const targets = options.all
    ? (await listSandboxes(client, { state: ['running', 'paused'] })).map((s) => s.sandboxId)
    : ids;
  const results: { sandboxId: string; killed: boolean }[] = [];
  for (const sandboxId of targets) {
    const killed = await withSpinner(`killing ${sandboxId}`, () => killSandbox(client, sandboxId));
    results.push({ sandboxId, killed });
  }
  if (options.json) return printJson(results);
  for (const { sandboxId, killed } of results) {
    printLine(killed ? `killed ${sandboxId}` : `${sandboxId} had already ended`);
  }
  if (results.length === 0) printLine('no running or paused sandboxes');
}

async function timeout(id: string, ms: number, options: { json?: boolean }): Promise<void> {
  const { client } = await openControl();
  await setSandboxTimeout(client, id, ms);
  const info = await getSandboxInfo(client, id);
  if (options.json) return printJson(info);
  printLine(`sandbox ${id} now expires ${relative(info.expiresAt)} (${info.expiresAt})`);
}

async function network(
  id: string,
  options: {
    allow?: string[];
    deny?: string[];
    egressProxy?: EgressProxy;
    log?: boolean;
    json?: boolean;
  },
): Promise<void> {
  const { client } = await openControl();
  if (options.allow || options.deny || options.egressProxy) {
    const info = await setSandboxNetwork(client, id, {
      allowOut: options.allow ?? [],
      denyOut: options.deny ?? [],
      ...(options.egressProxy ? { egressProxy: withPassword(options.egressProxy) } : {}),
    });
    if (options.json) return printJson(info.network ?? null);
    return printLine(
      `sandbox ${id}: ${networkText(info.network ?? { allowOut: [], denyOut: [] })}`,
    );
  }
  const info = await getSandboxInfo(client, id);
  if (!info.network) {
    if (options.json) return printJson(null);
    return printLine(
      `sandbox ${id} is not on the internet network (it has none but its loopback, or the host's); create one with --allow/--deny or from a template with network: internet`,
    );
  }
  const stats = await getSandboxNetwork(client, id);
  if (options.json) return printJson(stats);
  printLine(`sandbox ${id}: ${networkText(stats)}`);
  printLine(`egress: ${stats.allowed} allowed, ${stats.refused} refused`);
  if (options.log) {
    for (const event of stats.recent) {
      printLine(
        `${event.time}  ${event.allowed ? 'allowed' : 'refused'}  ${event.kind.padEnd(7)} ${event.target}  (${event.rule})`,
      );
    }
  }
}

function metricCells(m: SandboxMetric): string[] {
  return [
    m.timestamp.slice(11, 19),
    `${m.cpuUsedPct.toFixed(1)}% of ${m.cpuCount}`,
    `${formatBytes(m.memUsed)} / ${formatBytes(m.memTotal)}`,
    `${formatBytes(m.diskUsed)} / ${formatBytes(m.diskTotal)}`,
    String(m.processes),
    m.netRxBytes === null || m.netTxBytes === null
      ? 'not measured (host network)'
      : `${formatBytes(m.netRxBytes)} in, ${formatBytes(m.netTxBytes)} out`,
  ];
}

const METRIC_HEADER = ['time', 'cpu', 'memory', 'disk', 'processes', 'network'];
const METRIC_WIDTHS = [10, 14, 24, 24, 9, 28];

/** One row of `abx metrics --watch`, in fixed columns (the rows come one at a time). */
function watchLine(cells: readonly string[]): string {
  return cells
    .map((cell, i) => cell.padEnd(METRIC_WIDTHS[i] ?? 0))
    .join(' ')
    .trimEnd();
}

async function metrics(
  id: string,
  options: { json?: boolean; last?: number; watch?: boolean },
): Promise<void> {
  const { client } = await openControl();
  const samples = await getSandboxMetrics(client, id);
  const shown = options.last === undefined ? samples : samples.slice(-options.last);
  if (options.watch) return watchMetrics(client, id, shown, options.json === true);
  if (options.json) return printJson(shown);
  if (shown.length === 0) {
    return printLine(
      `sandbox ${id} has no samples yet: the daemon takes one every 5 s (ABX_METRICS_INTERVAL_MS)`,
    );
  }
  printTable(METRIC_HEADER, shown.map(metricCells));
}

/**
 * Prints `shown`, then each new sample as it comes (a JSON line each with `json`), until the
 * sandbox ends.
 */
async function watchMetrics(
  client: Parameters<typeof getSandboxMetrics>[0],
  id: string,
  shown: SandboxMetric[],
  json: boolean,
): Promise<void> {
  const print = (m: SandboxMetric) =>
    printLine(json ? JSON.stringify(m) : watchLine(metricCells(m)));
  if (!json) printLine(watchLine(METRIC_HEADER));
  for (const m of shown) print(m);
  let after = shown.length > 0 ? Date.parse((shown.at(-1) as SandboxMetric).timestamp) : 0;
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const info = await getSandboxInfo(client, id);
    for (const m of await getSandboxMetrics(client, id, { start: after + 1 })) {
      print(m);
      after = Date.parse(m.timestamp);
    }
    if (info.state !== 'running') {
      if (!json) printLine(`sandbox ${id} ended (${info.state}: ${info.endReason})`);
      return;
    }
  }
}

async function snapshot(id: string, name: string, options: { json?: boolean }): Promise<void> {
  const { client } = await openControl();
  const template = await withSpinner(`saving sandbox ${id} as ${name}`, () =>
    snapshotSandbox(client, id, name),
  );
  if (options.json) return printJson(template);
  printLine(
    `saved sandbox ${id} as template '${template.name}'; start one with: abx create --template ${template.name}`,
  );
}

function positiveCount(text: string): number {
  const count = Number(text);
  if (!/^\d+$/.test(text) || count < 1) {
    throw new InvalidArgumentError(`give a whole number of samples, 1 or more, not '${text}'`);
  }
  return count;
}

/** `abx create|list|info|kill|timeout|network|metrics|snapshot`: the life of sandboxes. */
export function addSandboxCommands(program: Command): void {
  withExamples(
    program
      .command('create')
      .description('Create a sandbox and print its id.')
      .option('-t, --template <name>', 'template to start from', 'base')
      .option(
        '--timeout <duration>',
        "lifetime before it is reaped, at most 24h (default: the template's)",
        lifetimeArg,
      )
      .option(
        '-e, --env <KEY=VALUE>',
        'environment variable of its processes (repeatable)',
        collectPairs,
      )
      .option(
        '--meta <KEY=VALUE>',
        'a label to find it by, with list --meta (repeatable)',
        collectPairs,
      )
      .option(
        '--allow <entries>',
        'internet network: reach these CIDRs, domains or *.domain wildcards (repeatable, comma-separated; an allow wins over a deny)',
        collectEntries,
      )
      .option(
        '--deny <entries>',
        'internet network: do not reach these (0.0.0.0/0: anything --allow does not name)',
        collectEntries,
      )
      .option(
        '--egress-proxy <url>',
        `internet network: send what it may reach through your SOCKS5 proxy, socks5://[user@]host:port (password from ${EGRESS_PROXY_PASSWORD_ENV}); other TCP than 80 and 443 is refused`,
        egressProxyArg,
      )
      .option('--internet', "the internet network, with the template's lists or none")
      .option(
        '--no-internet',
        'no network but its loopback (what --allow names still passes on internet)',
      )
      .option(
        '--auto-pause',
        'at its timeout, pause it (frozen, memory kept) instead of killing it; resume with abx resume',
      )
      .option('--hibernate', 'with --auto-pause: hibernate instead (its disk kept, memory freed)')
      .option(
        '--auto-resume',
        'with --auto-pause: a request for it (abx exec, a port through the gateway) resumes it',
      )
      .option(
        '-v, --volume <name:path[:ro]>',
        'mount a volume (abx volume create) at a folder inside the home, /tmp or /mnt; :ro for read-only (repeatable)',
        collectVolumes,
      )
      .option(
        '-w, --workspace <dir[:path]>',
        'mount a folder of this host copy-on-write at path (default /home/user/workspace): the sandbox writes its own layer, never the folder; review with abx diff, write back with abx apply (root daemon; an admin key any folder, another key one your user can read)',
        workspaceArg,
      )
      .option(
        '--upload',
        'with --workspace: send the folder from this machine (a daemon elsewhere; any key); apply the changes here with abx apply ID --local DIR',
      )
      .option('--gitignore', 'with --upload: leave out what .gitignore excludes (git ls-files)')
      .option('-q, --quiet', 'print the id alone')
      .option('--json', 'print the sandbox as JSON')
      .action(create),
    'abx create --template data-tools --timeout 10m --env MODE=dev',
    'abx create --volume data:/mnt/data --volume models:/mnt/models:ro',
    'abx create --workspace ./repo:/home/user/repo',
    'abx create --workspace . --upload --gitignore',
    'ABX_EGRESS_PROXY_PASSWORD=… abx create --allow pypi.org --egress-proxy socks5://me@proxy.example.com:1080',
    'id=$(abx create -q)',
  );

  withExamples(
    program
      .command('list')
      .alias('ps')
      .description('List sandboxes: running ones, or all with --all.')
      .option('-a, --all', 'include ended sandboxes (killed, expired, dead)')
      .option(
        '--state <states>',
        `only sandboxes in these states, comma-separated (${STATES.join(', ')})`,
        statesArg,
      )
      .option('-t, --template <name>', 'only sandboxes of this template')
      .option('--meta <KEY=VALUE>', 'only sandboxes with this label (repeatable)', collectPairs)
      .option('--json', 'print JSON')
      .action(list),
    'abx list --meta owner=ci --json',
    'abx list --state killed,expired,dead',
  );

  withExamples(
    program
      .command('info <id>')
      .description('Show a sandbox: template, state, when it expires, capabilities, labels.')
      .option('--json', 'print JSON')
      .action(async (id: string, options: { json?: boolean }) => {
        const info = await getSandboxInfo((await openControl()).client, id);
        if (options.json) printJson(info);
        else printInfo(info);
      }),
    'abx info i1a2b3c4d5e6f7g8',
  );

  withExamples(
    program
      .command('kill [ids...]')
      .description('Kill sandboxes and every process in them.')
      .option('--all', 'kill every running or paused sandbox')
      .option('--json', 'print what was killed as JSON')
      .action(kill),
    'abx kill i1a2b3c4d5e6f7g8',
    'abx kill --all',
  );

  withExamples(
    program
      .command('pause')
      .description(
        'Pause a running sandbox: its processes are frozen where they are, with their memory, using no CPU. With --hibernate its processes end and their memory is freed instead, while its files (home, /tmp, an image’s changes) and environment are kept. A paused sandbox keeps its id and token and counts against no key’s limit; it is removed after the daemon’s paused timeout (30 days).',
      )
      .argument('<id>', 'the sandbox')
      .option('--hibernate', 'end its processes, keep its disk (see above)')
      .option('--json', 'print the sandbox as JSON')
      .action(pause),
    'abx pause i1a2b3c4d5e6f7g8',
    'abx pause i1a2b3c4d5e6f7g8 --hibernate && abx resume i1a2b3c4d5e6f7g8',
  );

  withExamples(
    program
      .command('resume')
      .description(
        'Run a paused sandbox again: a frozen one where its processes were, a hibernated one started anew on its files. SDK calls (commands, files) resume a paused sandbox by themselves.',
      )
      .argument('<id>', 'the sandbox')
      .option(
        '--timeout <duration>',
        "its lifetime from now, at most 24h (default: the template's); applied too when the sandbox was running already (resumed by its traffic)",
        lifetimeArg,
      )
      .option('--json', 'print the sandbox as JSON')
      .action(resume),
    'abx resume i1a2b3c4d5e6f7g8 --timeout 1h',
  );

  withExamples(
    program
      .command('fork')
      .description(
        'Start new sandboxes from a running or paused one: each runs on a copy of its files (home, /tmp, an image’s changes) taken while it was frozen for an instant, with its network policy, environment and labels, and an id and token of its own. Its processes are not copied: only envd runs in a fork.',
      )
      .argument('<id>', 'the sandbox to fork')
      .option('-n, --count <n>', 'how many forks, 1 to 10 (default 1)', forkCountArg)
      .option(
        '--timeout <duration>',
        "each fork's lifetime, at most 24h (default: the template's)",
        lifetimeArg,
      )
      .option('--meta <KEY=VALUE>', 'a label added to the forks (repeatable)', collectPairs)
      .option('-q, --quiet', 'print the ids alone, one a line')
      .option('--json', 'print the forks as JSON')
      .action(fork),
    'abx fork i1a2b3c4d5e6f7g8',
    'abx fork i1a2b3c4d5e6f7g8 --count 3 -q',
  );

  withExamples(
    program
      .command('timeout')
      .description('Set the time a sandbox has left before it is reaped, counted from now.')
      .argument('<id>', 'the sandbox')
      .argument('<duration>', 'time left: 30s, 10m, 1h (at most 24h)', lifetimeArg)
      .option('--json', 'print the sandbox as JSON')
      .action(timeout),
    'abx timeout i1a2b3c4d5e6f7g8 30m',
  );

  withExamples(
    program
      .command('network')
      .description(
        "Show an internet sandbox's egress policy, or replace it with --allow and --deny (new connections follow it at once; see docs/network.md).",
      )
      .argument('<id>', 'the sandbox')
      .option(
        '--allow <entries>',
        'CIDRs, domains or *.domain wildcards to reach (repeatable, comma-separated)',
        collectEntries,
      )
      .option('--deny <entries>', 'what not to reach (0.0.0.0/0: all but --allow)', collectEntries)
      .option(
        '--egress-proxy <url>',
        `through your SOCKS5 proxy, socks5://[user@]host:port (password from ${EGRESS_PROXY_PASSWORD_ENV}); a change without it goes out directly`,
        egressProxyArg,
      )
      .option('--log', 'also print the latest decisions (DNS, HTTP, TLS), each with its rule')
      .option('--json', 'print the policy (and counters, when showing) as JSON')
      .action(network),
    'abx network i1a2b3c4d5e6f7g8 --log',
    'abx network i1a2b3c4d5e6f7g8 --allow pypi.org,files.pythonhosted.org --deny 0.0.0.0/0',
  );

  withExamples(
    program
      .command('metrics')
      .description(
        "Show a running sandbox's use over time: CPU (a percent of its cores: its limit, else the host's), memory, disk, processes and network bytes in and out, sampled by the daemon every 5 s (ABX_METRICS_INTERVAL_MS), the last 720 kept.",
      )
      .argument('<id>', 'the sandbox')
      .option('-n, --last <count>', 'only the latest samples', positiveCount)
      .option('-w, --watch', 'then print each new sample as it comes, until the sandbox ends')
      .option('--json', 'print the samples as JSON (with --watch: a JSON line per sample)')
      .action(metrics),
    'abx metrics i1a2b3c4d5e6f7g8 --last 12',
    'abx metrics i1a2b3c4d5e6f7g8 --last 1 --watch',
  );

  withExamples(
    program
      .command('snapshot')
      .description(
        "Save a running sandbox as a template: new sandboxes of it start from its current files (listed and removed with `abx template`). The snapshot is your key's own: only it and admin keys see it, until an admin shares it (abx template publish).",
      )
      .argument('<id>', 'the sandbox')
      .argument(
        '<name>',
        "the template to save it as (replaced if it is yours; another key's name is refused)",
      )
      .option('--json', 'print the template as JSON')
      .action(snapshot),
    'abx snapshot i1a2b3c4d5e6f7g8 prepared && abx create --template prepared',
  );
}
