import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { SANDBOX_RUN_DIR } from '../protocol/constants.js';
import { DEFAULT_UID, ENVD_ROOT_SOCKET, SUDO_SOCKET } from './constants.js';
import { serveSudo } from './sudo-server.js';

// The first process of a root-allowing image sandbox, as its root (uid 0 of the sandbox's own
// user namespace, see src/providers/local/root-userns.ts). Its arguments are the default user's
// envd command line, as any sandbox starts it. It starts two envds: root's on ENVD_ROOT_SOCKET
// (where the daemon sends `user: 'root'` requests) and the default user's, exactly as a sandbox
// without root runs it, as uid 1000 with no capability; and serves `sudo` on SUDO_SOCKET. When
// the default user's envd ends, so does the sandbox.

const envdArgv = process.argv.slice(2);
const option = (name: string): string | undefined => {
  const at = envdArgv.indexOf(name);
  return at >= 0 ? envdArgv[at + 1] : undefined;
};
const replaced = (argv: string[], name: string, value: string): string[] => {
  const at = argv.indexOf(name);
  if (at < 0) return [...argv, name, value];
  const copy = [...argv];
  copy[at + 1] = value;
  return copy;
};
const tokenFile = option('--token-file');
if (envdArgv.length === 0 || !tokenFile || !option('--socket')) {
  process.stderr.write(
    'usage: root.cjs NODE [NODE OPTIONS] ENVD.cjs --socket PATH --token-file FILE ...\n',
  );
  process.exit(2);
}

// /run/abx is the sandbox's root's (bwrap made it as uid 0): the default user may create its
// sockets there (sticky: never remove or replace root's), and owns the ports folder and its
// token's copy, as in a sandbox without root.
chmodSync(SANDBOX_RUN_DIR, 0o1777);
const portsDir = option('--ports-dir');
if (portsDir) chownSync(portsDir, DEFAULT_UID, DEFAULT_UID);
const rootToken = `${SANDBOX_RUN_DIR}/token-root`;
writeFileSync(rootToken, readFileSync(tokenFile), { mode: 0o600 });
chownSync(tokenFile, DEFAULT_UID, DEFAULT_UID);
const rootPorts = `${SANDBOX_RUN_DIR}/ports-root`;
mkdirSync(rootPorts, { mode: 0o700, recursive: true });

const [node, ...envd] = envdArgv as [string, ...string[]];
let rootArgs = replaced(envd, '--socket', ENVD_ROOT_SOCKET);
rootArgs = replaced(rootArgs, '--token-file', rootToken);
rootArgs = replaced(rootArgs, '--ports-dir', rootPorts);
// Root's home is its working directory too: as on E2B, a relative path or a command without a
// cwd is root's /root, not the default user's home.
const rootHome = existsSync('/root') ? '/root' : '/';
rootArgs = replaced(rootArgs, '--home', rootHome);
const rootEnv = {
  ...process.env,
  HOME: rootHome,
  USER: 'root',
  LOGNAME: 'root',
};

const children: ChildProcess[] = [];
function end(code: number): never {
  for (const child of children) child.kill('SIGKILL');
  process.exit(code);
}

const rootEnvd = spawn(node, rootArgs, { stdio: 'inherit', env: rootEnv, cwd: rootHome });
children.push(rootEnvd);
rootEnvd.on('exit', (code, signal) => {
  process.stderr.write(`abx root: root's envd ended (${signal ?? `exit ${code}`})\n`);
  end(1);
});

serveSudo(SUDO_SOCKET).then(
  () => {
    // uid and gid 1000 with no supplementary group: the kernel drops every capability (and the
    // ambient set) on the change from uid 0; no_new_privs (bwrap's) holds for it and its children.
    const userEnvd = spawn(node, envd, {
      stdio: 'inherit',
      uid: DEFAULT_UID,
      gid: DEFAULT_UID,
      env: process.env,
    });
    children.push(userEnvd);
    userEnvd.on('exit', (code, signal) => end(code ?? (signal ? 1 : 0)));
  },
  (error: Error) => {
    process.stderr.write(`abx root: cannot serve sudo on ${SUDO_SOCKET}: ${error.message}\n`);
    end(1);
  },
);

for (const name of ['SIGTERM', 'SIGINT'] as const) {
  process.on(name, () => {
    for (const child of children) child.kill(name);
  });
}
