import { shellQuote } from '../util/shell-quote.js';
import { commandUsage } from './arguments.js';
import type { ArgValue, CustomCommand, Kwargs } from './custom-command.js';
import { ArgumentError } from './errors.js';

/**
 * The `command:` of a YAML custom command is shell text with `{arg}` placeholders; `{{` and `}}`
 * stand for literal braces, and shell syntax such as `${HOME}` or awk's `'{print $1}'` passes
 * through untouched.
 *
 * Values never enter the shell text. Rendering assigns each value to a shell variable in a
 * single-quoted word of its own, at the top of the script where we know the shell is unquoted,
 * and each placeholder becomes a reference to that variable. A variable's value is never parsed
 * again by the shell, so `$(...)`, backticks and `;` in a value stay literal text even if the
 * template puts a placeholder somewhere unexpected.
 */

/** How the shell reads the place where a placeholder stands. */
type Context = 'plain' | 'dquote' | 'squote' | 'ansi';

interface PlaceholderSegment {
  name: string;
  context: Context;
}

/** A parsed shell template: literal text and placeholders, in order. */
export type ShellTemplate = (string | PlaceholderSegment)[];

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*/;

/** Shell variable that carries the value of argument `name` while the command runs. */
export function argVariable(name: string): string {
  return `ABX_ARG_${name}`;
}

/** Splits shell template text into literal text and placeholders, tracking shell quoting. */
export function parseShellTemplate(text: string): ShellTemplate {
  const segments: ShellTemplate = [];
  let literal = '';
  // Each frame is a quoting context; `$(` opens a plain frame even inside double quotes.
  const stack: { context: Context; parens: number }[] = [{ context: 'plain', parens: 0 }];
  const top = () => stack[stack.length - 1] as { context: Context; parens: number };
  let i = 0;
  while (i < text.length) {
    const ch = text[i] as string;
    const next = text[i + 1];
    const frame = top();
    if ((ch === '{' && next === '{') || (ch === '}' && next === '}')) {
      literal += ch;
      i += 2;
      continue;
    }
    if (ch === '{') {
      const name = IDENTIFIER.exec(text.slice(i + 1))?.[0];
      if (name && text[i + 1 + name.length] === '}') {
        if (literal) segments.push(literal);
        literal = '';
        segments.push({ name, context: frame.context });
        i += name.length + 2;
        continue;
      }
    }
    literal += ch;
    i += 1;
    switch (frame.context) {
      case 'squote':
        if (ch === "'") stack.pop();
        break;
      case 'ansi':
        if (ch === '\\' && next !== undefined) {
          literal += next;
          i += 1;
        } else if (ch === "'") stack.pop();
        break;
      case 'dquote':
      case 'plain': {
        if (ch === '\\' && next !== undefined) {
          literal += next;
          i += 1;
        } else if (ch === '$' && next === '{') {
          // Parameter expansion: copied whole, its braces are the shell's.
          let depth = 0;
          let j = i;
          for (; j < text.length; j++) {
            if (text[j] === '{') depth++;
            else if (text[j] === '}' && --depth === 0) break;
          }
          literal += text.slice(i, j + 1);
          i = j + 1;
        } else if (ch === '$' && next === '(') {
          literal += next;
          i += 1;
          stack.push({ context: 'plain', parens: 0 });
        } else if (ch === '"') {
          if (frame.context === 'dquote') stack.pop();
          else stack.push({ context: 'dquote', parens: 0 });
        } else if (frame.context === 'plain' && ch === "'") {
          const ansi = literal.length >= 2 && literal[literal.length - 2] === '$';
          stack.push({ context: ansi ? 'ansi' : 'squote', parens: 0 });
        } else if (frame.context === 'plain' && ch === '(') {
          frame.parens++;
        } else if (frame.context === 'plain' && ch === ')') {
          if (frame.parens > 0) frame.parens--;
          else if (stack.length > 1) stack.pop();
        }
        break;
      }
    }
  }
  if (literal) segments.push(literal);
  return segments;
}

/** Problems with a template's placeholders, given the command's declared argument names. */
export function checkPlaceholders(template: ShellTemplate, argNames: readonly string[]): string[] {
  const problems: string[] = [];
  for (const segment of template) {
    if (typeof segment === 'string') continue;
    if (!argNames.includes(segment.name)) {
      problems.push(
        `placeholder {${segment.name}} names no declared argument (${
          argNames.length > 0 ? `declared: ${argNames.join(', ')}` : 'the command declares none'
        }); declare it under args, or write {{${segment.name}}} for literal braces`,
      );
    } else if (segment.context === 'squote' || segment.context === 'ansi') {
      problems.push(
        `placeholder {${segment.name}} is inside single quotes, where the shell would not expand it; move it outside the quotes (it expands to one word)`,
      );
    }
  }
  return problems;
}

function valueText(value: ArgValue): string {
  return typeof value === 'string' ? value : String(value);
}

/**
 * Renders a YAML command with validated kwargs into one `sh` script. Every value is quoted as a
 * single shell word; a value containing a NUL byte (which no shell string can hold) is refused.
 */
export function renderShellCommand(command: CustomCommand, kwargs: Kwargs): string {
  if (command.command === undefined) {
    throw new TypeError(`'${command.name}' is not a shell command (source: ${command.source})`);
  }
  const template = parseShellTemplate(command.command);
  const used = [...new Set(template.flatMap((s) => (typeof s === 'string' ? [] : [s.name])))];
  const problems: string[] = [];
  const assignments: string[] = [];
  for (const name of used) {
    const value = kwargs[name];
    if (value === undefined) problems.push(`missing value for placeholder {${name}}`);
    else if (valueText(value).includes('\0')) problems.push(`${name} contains a NUL byte`);
    else assignments.push(`${argVariable(name)}=${shellQuote(valueText(value))}`);
  }
  if (problems.length > 0) throw ArgumentError.of(command.name, problems, commandUsage(command));
  const body = template
    .map((s) => {
      if (typeof s === 'string') return s;
      const reference = `\${${argVariable(s.name)}}`;
      return s.context === 'dquote' ? reference : `"${reference}"`;
    })
    .join('');
  return assignments.length > 0 ? `${assignments.join('\n')}\n${body}` : body;
}
