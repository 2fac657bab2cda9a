import { spawn } from 'node:child_process';
import { chmodSync, rmSync, statSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
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
  type SudoHeader,
} from './frames.js';

/** What a command run through sudo starts with: a clean root environment, as sudo's env_reset. */
const ROOT_ENV = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  HOME: '/root',
  USER: 'root',
  LOGNAME: 'root',
  SHELL: '/bin/sh',
  LANG: 'C.UTF-8',
  SUDO_USER: 'user',
  SUDO_UID: '1000',
  SUDO_GID: '1000',
};

/**
 * The sandbox's egress proxy and trust (set by the daemon for every process of an internet
 * sandbox): kept, or `sudo apt-get` could not reach the mirror through egress.
 */
const KEPT =
  /^(https?_proxy|no_proxy|all_proxy|HTTPS?_PROXY|NO_PROXY|ALL_PROXY|SSL_CERT_FILE|CURL_CA_BUNDLE|REQUESTS_CA_BUNDLE|PIP_CERT|NODE_EXTRA_CA_CERTS)$/;
/** What the caller may pass on (sudo keeps TERM; `sudo NAME=value cmd` sets the rest). */
const FROM_CALLER = /^(TERM|COLORTERM|LANG|LC_[A-Z]+|DEBIAN_FRONTEND)$/;

function environment(asked: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = { ...ROOT_ENV };
  for (const [name, value] of Object.entries(process.env)) {
    if (KEPT.test(name) && value !== undefined) env[name] = value;
  }
  for (const [name, value] of Object.entries(asked)) {
    if (typeof value === 'string' && /^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) env[name] = value;
  }
  return env;
}

function validHeader(value: unknown): value is SudoHeader {
  const header = value as SudoHeader;
  return (
    typeof header === 'object' &&
    header !== null &&
    Array.isArray(header.argv) &&
    header.argv.length > 0 &&
    header.argv.every((word) => typeof word === 'string' && !word.includes('\0')) &&
    typeof header.cwd === 'string' &&
    typeof header.env === 'object' &&
    header.env !== null
  );
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

/** One sudo call: the header, then stdin in, stdout/stderr and the exit out. */
function serve(socket: Socket): void {
  let child: ReturnType<typeof spawn> | undefined;
  const refuse = (message: string) => {
    if (socket.writableEnded) return;
    socket.end(
      Buffer.concat([
        frame(STDERR, `sudo: ${message}\n`),
        frame(EXIT, JSON.stringify({ code: 1, signal: null })),
      ]),
    );
  };
  socket.on('error', () => child?.kill('SIGKILL'));
  socket.on('close', () => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGHUP');
  });
  readFrames(socket, (kind, payload) => {
    if (kind === HEADER && !child) {
      let header: unknown;
      try {
        header = JSON.parse(payload.toString('utf8'));
      } catch {
        header = undefined;
      }
      if (!validHeader(header)) {
        refuse('the request is not a command (argv, cwd, env)');
        return;
      }
      const [command, ...args] = header.argv as [string, ...string[]];
      const filtered: Record<string, string> = {};
      for (const [name, value] of Object.entries(header.env)) {
        if (FROM_CALLER.test(name) || /^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) filtered[name] = value;
      }
      child = spawn(command, args, {
        cwd: isDirectory(header.cwd) ? header.cwd : '/',
        env: environment(filtered),
        stdio: ['pipe', 'pipe', 'pipe'],
      });
      child.stdout?.on('data', (chunk: Buffer) => socket.write(frame(STDOUT, chunk)));
      child.stderr?.on('data', (chunk: Buffer) => socket.write(frame(STDERR, chunk)));
      child.stdin?.on('error', () => undefined);
      child.on('error', (error: NodeJS.ErrnoException) => {
        refuse(
          error.code === 'ENOENT'
            ? `${command}: command not found`
            : `${command}: ${error.message}`,
        );
      });
      child.on('close', (code, signal) => {
        // A program that could not start was refused already ('error', then 'close'): a second
        // end would fail the socket, and the caller could read a reset instead of the refusal.
        if (socket.destroyed || socket.writableEnded) return;
        socket.end(frame(EXIT, JSON.stringify({ code, signal })));
      });
      return;
    }
    if (!child) {
      refuse('the first frame must name the command');
      return;
    }
    if (kind === STDIN) child.stdin?.write(payload);
    else if (kind === STDIN_END) child.stdin?.end();
    else if (kind === SIGNAL) {
      const name = payload.toString('utf8');
      if (/^SIG[A-Z0-9]+$/.test(name)) {
        try {
          child.kill(name as NodeJS.Signals);
        } catch {
          // an unknown signal's name: ignored
        }
      }
    }
  });
}

/**
 * Serves `sudo` for the sandbox's default user on `path` (mode 0666, in the sandbox's own
 * /run/abx: only the sandbox's processes can reach it). Every process of a root-allowing sandbox
 * may become root: the boundary is the sandbox, not its user.
 */
export function serveSudo(path: string): Promise<Server> {
  rmSync(path, { force: true });
  const server = createServer(serve);
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => {
      chmodSync(path, 0o666);
      resolve(server);
    });
  });
}
