import { cpSync, existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { CAPABILITIES, type Capability } from '../protocol/capabilities.js';
import { SANDBOX_HOME } from '../protocol/constants.js';
import { observeSpawns } from '../server/child-process.js';
import { FileMetadataStore } from '../server/file-metadata.js';
import { CORE } from '../server/groups/core.js';
import { DEV_TOOLS } from '../server/groups/dev-tools.js';
import { fileOps } from '../server/groups/files.js';
import { PROCESS } from '../server/groups/process.js';
import { SYSTEM } from '../server/groups/system.js';
import { TERMINAL } from '../server/groups/terminal.js';
import { SandboxServer } from '../server/server.js';
import { ARCHIVE } from './archive.js';
import { capabilityCheck, parseCapabilities, parseTokens } from './capabilities.js';
import { codeGroup } from './code.js';
import { ENV } from './env.js';
import { EXEC } from './exec.js';
import { FILES_BATCH } from './files-batch.js';
import { SETTLE_MS, settleGarbage, sleepWhenIdle } from './idle.js';
import { portsGroup } from './ports.js';
import { logProcess, logsGroup, sandboxLog } from './sandbox-log.js';
import { runtimeServerScript, ServerStarter, serverStartGroup } from './server-start.js';
import { tokensGroup } from './tokens.js';
import { watchGroup } from './watch.js';

// envd: the daemon every sandbox runs first. The command server's file, process, system and
// terminal groups, plus port forwarding, on a Unix socket that the host's gateway reaches.
const { values } = parseArgs({
  options: {
    socket: { type: 'string' },
    // HOST:PORT to serve on over TCP (a pod, reached at its address), instead of or besides
    // --socket; the token is required on every request there exactly as on the socket.
    listen: { type: 'string' },
    'ports-dir': { type: 'string' },
    // With --listen: forwarded ports listen on this address (the pod's) as well as in --ports-dir.
    'ports-host': { type: 'string' },
    'token-file': { type: 'string' },
    // The template's capabilities (default all) and its name, for the refusals' wording.
    capabilities: { type: 'string' },
    template: { type: 'string' },
    // A read-only template home to copy into an empty home first (sandboxes whose home is a
    // size-limited tmpfs, which starts empty: rootless mode).
    'home-template': { type: 'string' },
    // The same for /tmp (a hibernated rootless sandbox waking: its /tmp as it was).
    'tmp-template': { type: 'string' },
    home: { type: 'string' },
    // Exit (code 75: asleep) after this many ms with nothing to do; the shell loop the local
    // provider runs envd under starts it again on the next request (idle.ts). 0 or absent: never.
    'idle-exit-ms': { type: 'string' },
    // Under envd's front (native/envd-front), which keeps the sandbox's log for the sandbox's
    // whole life: each line of the log also goes to stdout as `{"log":{at,level,message,fields}}`.
    'log-stdout': { type: 'boolean' },
    // Fill the home (and /tmp) from their templates as at a start, then exit 0 without serving:
    // the front runs this once before it first answers (nothing else of envd runs yet).
    'seed-only': { type: 'boolean' },
  },
  strict: true,
});
const usage = (): never => {
  process.stderr.write(
    'usage: node envd.cjs (--socket PATH | --listen HOST:PORT) --ports-dir DIR [--ports-host HOST] --token-file FILE [--capabilities LIST --template NAME]\n',
  );
  process.exit(2);
};
if ((!values.socket && !values.listen) || !values['ports-dir'] || !values['token-file']) usage();
const tokenFile = values['token-file'] as string;
const idleMs = Number(values['idle-exit-ms'] ?? '0');
if (!Number.isSafeInteger(idleMs) || idleMs < 0) {
  process.stderr.write(
    `envd: --idle-exit-ms ${values['idle-exit-ms']} is not a whole number of ms\n`,
  );
  process.exit(2);
}
let listen: { host: string; port: number } | undefined;
if (values.listen) {
  // The last colon splits: a pod's IPv6 address may come bare from the downward API.
  const found = /^\[?([^[\]]+?)\]?:(\d{1,5})$/.exec(values.listen);
  const port = Number(found?.[2]);
  if (!found || port < 1 || port > 65535) {
    process.stderr.write(
      `envd: --listen ${values.listen} is not HOST:PORT (e.g. 0.0.0.0:49983 or [::]:49983)\n`,
    );
    process.exit(2);
  }
  listen = { host: found[1] as string, port };
}
let tokens: ReturnType<typeof parseTokens>;
let capabilities: Capability[];
try {
  // `-`: from stdin, where the shell loop that restarts a sleeping envd hands them on each start
  // (it read the token file once, before any other process of the sandbox existed).
  tokens = parseTokens(readFileSync(tokenFile === '-' ? 0 : tokenFile, 'utf8'));
  capabilities = parseCapabilities(values.capabilities ?? CAPABILITIES.join(','));
} catch (error) {
  process.stderr.write(`envd: ${(error as Error).message}\n`);
  process.exit(2);
}
// Gone before anything is served: no other process of the sandbox can have read it.
if (tokenFile !== '-') rmSync(tokenFile, { force: true });
if (!tokens) {
  process.stderr.write('envd: the token file is empty; refusing to serve without a token\n');
  process.exit(2);
}
const home = values.home ?? process.env.HOME ?? SANDBOX_HOME;
const metadataDir = join(resolve(home), '.abx', 'envd');
// envd's own state in the sandbox's /run/abx (a tmpfs that lives as long as the sandbox): a
// restarted envd (woken from a sleep) must not fill the home again, and keeps the environment
// `PUT /env` set.
const runDir = values.socket ? dirname(values.socket) : undefined;
const seededMarker = runDir ? join(runDir, 'seeded') : undefined;
const savedEnv = runDir ? join(runDir, 'env.json') : undefined;
if (savedEnv && existsSync(savedEnv)) {
  try {
    const env = JSON.parse(readFileSync(savedEnv, 'utf8')) as Record<string, unknown>;
    for (const [name, value] of Object.entries(env)) {
      if (typeof value === 'string' && /^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
        process.env[name] = value;
      }
    }
  } catch (error) {
    process.stderr.write(`envd: ignoring ${savedEnv}: ${(error as Error).message}\n`);
  }
}
// The next process and terminal ids of the envd before (woken from a sleep): ids go on, so one
// a client kept never names a later process.
const savedIds = runDir ? join(runDir, 'ids.json') : undefined;
let firstIds: { process: number; terminal: number } | undefined;
if (savedIds && existsSync(savedIds)) {
  try {
    const ids = JSON.parse(readFileSync(savedIds, 'utf8')) as Record<string, unknown>;
    const { process: p, terminal: t } = ids;
    if (
      Number.isSafeInteger(p) &&
      Number.isSafeInteger(t) &&
      (p as number) > 0 &&
      (t as number) > 0
    ) {
      firstIds = { process: p as number, terminal: t as number };
    } else {
      throw new Error('not two positive whole numbers');
    }
  } catch (error) {
    process.stderr.write(`envd: ignoring ${savedIds}: ${(error as Error).message}\n`);
  }
}
const seeded = seededMarker !== undefined && existsSync(seededMarker);
for (const [template, into] of [
  [values['home-template'], home],
  [values['tmp-template'], '/tmp'],
] as const) {
  if (!template || seeded) continue;
  try {
    cpSync(template, into, {
      recursive: true,
      force: true,
      preserveTimestamps: true,
      verbatimSymlinks: true,
    });
  } catch (error) {
    process.stderr.write(
      `envd: cannot fill ${into} from the template: ${(error as Error).message}\n`,
    );
    process.exit(1);
  }
}
if (seededMarker && (values['home-template'] || values['tmp-template']) && !seeded) {
  writeFileSync(seededMarker, '');
}
if (values['seed-only']) process.exit(0);
if (values.socket) rmSync(values.socket, { force: true });
const ports = portsGroup(values['ports-dir'] as string, values['ports-host']);
const watches = watchGroup({}, [metadataDir]);
// The command server's starts, from an idle process kept ahead (server.cjs is beside envd.cjs).
const starter = new ServerStarter(runtimeServerScript(dirname(resolve(process.argv[1] ?? '.'))));
const server = new SandboxServer({
  ...(firstIds ? { firstIds } : {}),
  ...(listen
    ? {
        host: listen.host,
        port: listen.port,
        ...(values.socket ? { extraSocketPath: values.socket } : {}),
      }
    : { socketPath: values.socket as string }),
  token: tokens.control,
  limitedToken: {
    token: tokens.client,
    check: capabilityCheck(values.template ?? 'unknown', capabilities),
  },
  catalog: [
    CORE,
    // File metadata (E2B's `X-Metadata-*`) in the home's .abx folder, where abx keeps its state:
    // on the sandbox's disk (it survives envd, counts against the disk's quota, goes with a
    // snapshot), made only when a file first gets metadata. docs/e2b.md, "File metadata".
    fileOps({ metadata: new FileMetadataStore(join(metadataDir, 'file-metadata.json')) }),
    PROCESS,
    EXEC,
    serverStartGroup(starter),
    SYSTEM,
    TERMINAL,
    DEV_TOOLS,
    ports,
    FILES_BATCH,
    // A watch of the home does not see envd's own metadata store change.
    watches,
    ARCHIVE,
    ENV,
    tokensGroup(({ client, control }) => server.replaceTokens({ control, limited: client })),
    // The code drivers (python_driver.py, js_driver.cjs) are shipped next to envd.cjs.
    codeGroup({ driversDir: dirname(resolve(process.argv[1] ?? '.')) }),
    logsGroup(),
  ],
  // Raw uploads stream to disk, so they may be large and slow (64 GiB within 1 h); JSON bodies
  // are read whole and keep the defaults (64 MiB within 30 s), so a trickling client cannot hold
  // a JSON request for an hour.
  streamBodyLimitBytes: 64 * 1024 ** 3,
  streamBodyTimeoutMs: 3_600_000,
  // The daemon holds a read of the log open all the time: it must not keep envd awake.
  idleNeutral: (req) => req.method === 'GET' && /^\/logs(\?|$)/.test(req.url ?? ''),
});
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.once(signal, () => {
    starter.stop();
    void server.stop();
  });
}
if (values['log-stdout']) {
  // Pipes are written synchronously on Linux: the line before a sleep's exit is not lost.
  sandboxLog.tap = ({ at, level, message, fields }) =>
    process.stdout.write(`${JSON.stringify({ log: { at, level, message, fields } })}\n`);
}
// The sandbox's log (GET /logs) has every process envd starts, by name only.
observeSpawns((child, file) => logProcess(child, file));
server.start().then(
  () => {
    // Under the front, which logged `envd started` when the sandbox did: this is its Node part.
    const started = values['log-stdout'] ? "envd's Node process started" : 'envd started';
    sandboxLog.write('info', started, { pid: String(process.pid) });
    // What its start and each spell of requests left is given back once they are over.
    server.settleWhenQuiet(SETTLE_MS, settleGarbage);
    if (idleMs > 0 && values.socket) {
      const socket = values.socket;
      sleepWhenIdle(idleMs, socket, {
        busyConnections: () => server.busyConnections(),
        accepted: () => server.accepted,
        spareChildren: () => {
          const spare = starter.status();
          return spare ? [spare.pid] : [];
        },
        holds: () => {
          if (watches.count() > 0) return `${watches.count()} file watch(es)`;
          if (ports.forwarding() > 0) return `${ports.forwarding()} forwarded connection(s)`;
          return undefined;
        },
        relisten: (path) => server.listenAlso(path),
        log: (message) => sandboxLog.write('info', message),
        beforeSleep: () => {
          starter.stop();
          ports.closeAll();
          if (savedEnv) writeFileSync(savedEnv, JSON.stringify(process.env), { mode: 0o600 });
          if (savedIds) writeFileSync(savedIds, JSON.stringify(server.nextIds()), { mode: 0o600 });
        },
      });
    }
    process.stdout.write(
      `${JSON.stringify({ event: 'listening', socket: values.socket, listen: values.listen, pid: process.pid })}\n`,
    );
    return server.stopped.then(() => process.exit(0));
  },
  (error: Error) => {
    process.stderr.write(
      `envd: cannot listen on ${values.listen ?? values.socket}: ${error.message}\n`,
    );
    process.exit(1);
  },
);
