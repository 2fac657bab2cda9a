import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { expect } from 'vitest';
import { ROOT } from '../helpers/build.js';

export const CLI = join(ROOT, 'dist', 'cli.js');

export interface AbxResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export interface RunOptions {
  /** Written to abx's stdin, which is then closed (closed at once without it). */
  input?: string;
  env?: Record<string, string>;
  /**
   * false: the program gets exactly `env` plus PATH, nothing of the test's environment (a client
   * "on another machine"); default true, `env` added to the test's environment.
   */
  inheritEnv?: boolean;
  /** Run it inside this network namespace (`ip netns exec NS`), as on another host. */
  netns?: string;
  cwd?: string;
}

/** Runs a program to its end, collecting its output; killed after 120 s so a hang fails a test. */
export function runProgram(
  file: string,
  args: readonly string[],
  options: RunOptions = {},
): Promise<AbxResult> {
  const [command, argv] = options.netns
    ? ['ip', ['netns', 'exec', options.netns, file, ...args]]
    : [file, args];
  const child = spawn(command, argv, {
    cwd: options.cwd ?? ROOT,
    env:
      options.inheritEnv === false
        ? { PATH: process.env.PATH ?? '/usr/bin:/bin', ...options.env }
        : { ...process.env, ...options.env },
    stdio: ['pipe', 'pipe', 'pipe'],
    timeout: 120_000,
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    stdout += d;
  });
  child.stderr.setEncoding('utf8').on('data', (d: string) => {
    stderr += d;
  });
  child.stdin.end(options.input ?? '');
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/**
 * The built `abx` bound to one private ABX_HOME, run as a child process with pipes (so: no
 * terminal, no colour, no spinner).
 */
export function abxIn(home: string) {
  const env = { ABX_HOME: home, NO_COLOR: '1' };
  const abx = (args: readonly string[], options: RunOptions = {}) =>
    runProgram(process.execPath, [CLI, ...args], { ...options, env: { ...env, ...options.env } });
  /** Runs abx with `--json` appended, expects exit 0 and returns the parsed output. */
  const json = async <T = unknown>(args: readonly string[]): Promise<T> => {
    const result = await abx([...args, '--json']);
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    return JSON.parse(result.stdout) as T;
  };
  return { abx, json, env };
}

/** Quotes a word for `sh -c`. */
export function sh(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/**
 * Runs a shell command line inside a fresh pty (util-linux `script`), as if typed at a terminal
 * of `cols`×`rows`. `respond` sees the screen output so far and may return keystrokes to type;
 * it is called as output arrives, so input goes in only once the program is ready for it.
 */
export function inPty(
  commandLine: string,
  options: {
    env?: Record<string, string>;
    respond?: (screen: string) => string | undefined;
  } = {},
): Promise<{ code: number | null; screen: string }> {
  const child = spawn('script', ['-qefc', `stty cols 91 rows 20; ${commandLine}`, '/dev/null'], {
    cwd: ROOT,
    env: { ...process.env, TERM: 'xterm', ...options.env },
    stdio: ['pipe', 'pipe', 'pipe'],
    timeout: 120_000,
  });
  let screen = '';
  const onOutput = (data: string) => {
    screen += data;
    const keys = options.respond?.(screen);
    if (keys) child.stdin.write(keys);
  };
  child.stdout.setEncoding('utf8').on('data', onOutput);
  child.stderr.setEncoding('utf8').on('data', onOutput);
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, screen }));
  });
}
