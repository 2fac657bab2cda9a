import { connect } from 'node:net';
import { constants } from 'node:os';
import { SUDO_SOCKET } from './constants.js';
import {
  EXIT,
  frame,
  HEADER,
  readFrames,
  SIGNAL,
  STDERR,
  STDIN,
  STDIN_END,
  STDOUT,
  type SudoExit,
} from './frames.js';

// `sudo` in a root-allowing sandbox (bound at /usr/bin/sudo): passwordless, as in E2B. It asks
// the sandbox's root (its init, on SUDO_SOCKET) to run the command, and passes stdin, stdout,
// stderr, signals and the exit code through. Options that only make sense with a password or
// another user are refused by name.

const USAGE =
  "usage: sudo [-E] [-H] [-n] [-S] [-u root] [NAME=value ...] COMMAND [ARG ...]   (abx's sudo: runs COMMAND as the sandbox's root)";

function fail(message: string, code = 1): never {
  process.stderr.write(`sudo: ${message}\n`);
  process.exit(code);
}

const args = process.argv.slice(2);
const env: Record<string, string> = {};
for (const name of ['TERM', 'COLORTERM']) {
  const value = process.env[name];
  if (value !== undefined) env[name] = value;
}
let shell: 'login' | 'plain' | undefined;
let preserve = false;
while (args.length > 0) {
  const word = args[0] as string;
  if (word === '--') {
    args.shift();
    break;
  }
  if (!word.startsWith('-') || word === '-') break;
  args.shift();
  if (word === '-u' || word === '--user') {
    const user = args.shift();
    if (user !== 'root' && user !== '#0' && user !== '0') {
      fail(`-u ${user ?? ''}: abx's sudo runs commands as root only`);
    }
  } else if (word.startsWith('--user=')) {
    if (!['root', '#0', '0'].includes(word.slice(7)))
      fail(`${word}: abx's sudo runs commands as root only`);
  } else if (word === '-E' || word === '--preserve-env') preserve = true;
  else if (['-H', '-n', '-S', '-k', '--non-interactive', '--set-home', '--stdin'].includes(word)) {
    // no password is ever asked; HOME is root's already
  } else if (word === '-i' || word === '--login') shell = 'login';
  else if (word === '-s' || word === '--shell') shell = 'plain';
  else if (word === '-h' || word === '--help') {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  } else if (word === '-V' || word === '--version') {
    process.stdout.write("abx's sudo (a sandbox's root, through its init)\n");
    process.exit(0);
  } else fail(`option ${word} is not supported by abx's sudo\n${USAGE}`);
}
while (args.length > 0 && /^[A-Za-z_][A-Za-z0-9_]*=/.test(args[0] as string)) {
  const assignment = args.shift() as string;
  const at = assignment.indexOf('=');
  env[assignment.slice(0, at)] = assignment.slice(at + 1);
}
if (preserve) {
  for (const [name, value] of Object.entries(process.env)) {
    if (value !== undefined && !(name in env) && !/^(PATH|HOME|USER|LOGNAME|SHELL)$/.test(name)) {
      env[name] = value;
    }
  }
}
let argv = args;
if (shell) {
  argv =
    argv.length === 0
      ? ['/bin/sh', ...(shell === 'login' ? ['-l'] : [])]
      : ['/bin/sh', '-c', argv.join(' ')];
}
if (argv.length === 0) fail(USAGE);

const socket = connect(SUDO_SOCKET);
socket.on('error', (error: NodeJS.ErrnoException) => {
  fail(
    error.code === 'ENOENT' || error.code === 'ECONNREFUSED'
      ? `this sandbox's root does not answer on ${SUDO_SOCKET}: root is not allowed here (a template allows it with allow_root: true)`
      : `cannot reach this sandbox's root: ${error.message}`,
  );
});
socket.on('connect', () => {
  socket.write(frame(HEADER, JSON.stringify({ argv, cwd: process.cwd(), env })));
  process.stdin.on('data', (chunk: Buffer) => socket.write(frame(STDIN, chunk)));
  process.stdin.on('end', () => socket.write(frame(STDIN_END)));
  process.stdin.on('error', () => socket.write(frame(STDIN_END)));
});
for (const name of ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT'] as const) {
  process.on(name, () => socket.write(frame(SIGNAL, name)));
}
let exited = false;
readFrames(socket, (kind, payload) => {
  if (kind === STDOUT) process.stdout.write(payload);
  else if (kind === STDERR) process.stderr.write(payload);
  else if (kind === EXIT) {
    exited = true;
    const { code, signal } = JSON.parse(payload.toString('utf8')) as SudoExit;
    const number = signal ? (constants.signals[signal as NodeJS.Signals] ?? 0) : 0;
    const status = code ?? 128 + number;
    process.stdout.write('', () => process.stderr.write('', () => process.exit(status)));
  }
});
socket.on('close', () => {
  if (!exited) fail("this sandbox's root closed the connection before the command ended");
});
