import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, test } from 'vitest';
import {
  ArgumentError,
  type CustomCommand,
  type Kwargs,
  parseTemplate,
  renderShellCommand,
} from '../../src/index.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'abx-shell-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

function shellCommand(command: string, args = '[{ name: msg }]'): CustomCommand {
  const template = parseTemplate(
    `name: t\ncustom_commands:\n  c:\n    command: ${JSON.stringify(command)}\n    args: ${args}\n`,
  );
  return template.customCommands[0] as CustomCommand;
}

/** Renders the command and runs it with `sh`, returning stdout. */
function run(command: CustomCommand, kwargs: Kwargs): string {
  return execFileSync('sh', ['-c', renderShellCommand(command, kwargs)], {
    cwd: dir,
    encoding: 'utf8',
  });
}

const HOSTILE = [
  '$(touch pwned); echo',
  '`touch pwned`',
  "'; touch pwned; echo '",
  '"; touch pwned; echo "',
  '$(touch pwned)\n; touch pwned',
  '${IFS}touch${IFS}pwned',
  '\\"; touch pwned #',
  'a && touch pwned || touch pwned',
  '-n',
  '*',
];

describe('placeholder substitution', () => {
  test.each(HOSTILE)('%j reaches the command as literal text', (value) => {
    const echo = shellCommand('printf "%s|" {msg}');
    expect(run(echo, { msg: value })).toBe(`${value}|`);
    expect(existsSync(join(dir, 'pwned'))).toBe(false);
  });

  test.each(HOSTILE)('%j stays literal inside double quotes too', (value) => {
    const echo = shellCommand('printf "%s|" "<{msg}>"');
    expect(run(echo, { msg: value })).toBe(`<${value}>|`);
    expect(existsSync(join(dir, 'pwned'))).toBe(false);
  });

  test('a placeholder is one word even with spaces, and works inside $( )', () => {
    const command = shellCommand('printf "[%s]" {msg} "$(printf %s {msg})"');
    expect(run(command, { msg: 'a  b' })).toBe('[a  b][a  b]');
  });

  test('typed values render as text', () => {
    const command = shellCommand(
      'echo {n} {f} {b}',
      '[{ name: n, type: int }, { name: f, type: float }, { name: b, type: bool }]',
    );
    expect(run(command, { n: 42, f: 0.5, b: true })).toBe('42 0.5 true\n');
  });

  test('shell braces pass through: ${VAR}, awk programs, {{ }} escapes', () => {
    const command = shellCommand(
      "X=hi; echo ${X} {{msg}} $(echo {msg} | awk '{print $1}')",
      '[{ name: msg }]',
    );
    expect(run(command, { msg: 'first second' })).toBe('hi {msg} first\n');
  });

  test('a value with a NUL byte is refused', () => {
    const echo = shellCommand('echo {msg}');
    expect(() => renderShellCommand(echo, { msg: 'a\0b' })).toThrow(ArgumentError);
    expect(() => renderShellCommand(echo, { msg: 'a\0b' })).toThrow(/msg contains a NUL byte/);
  });

  test('a decorated command cannot be rendered as shell', () => {
    const echo = { ...shellCommand('echo {msg}'), command: undefined, source: 'decorator' };
    expect(() => renderShellCommand(echo as CustomCommand, { msg: 'x' })).toThrow(
      /'c' is not a shell command/,
    );
  });
});
