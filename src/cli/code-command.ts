import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import type { CodeLanguage, Result } from '../sandbox/code.js';
import { Sandbox } from '../sandbox/sandbox.js';
import { ExitCode, UsageError } from './errors.js';
import { durationArg, withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface CodeOptions {
  language: CodeLanguage;
  file?: string;
  out?: string;
  timeout?: number;
  json?: boolean;
}

const BINARY: Record<string, string> = { png: 'png', jpeg: 'jpg', pdf: 'pdf' };

/** Where a result's images went (with --out), or what they are (without). */
function describeResult(result: Result, index: number, out: string | undefined): string[] {
  const lines: string[] = [];
  for (const [format, extension] of Object.entries(BINARY)) {
    const data = result[format as 'png' | 'jpeg' | 'pdf'];
    if (!data) continue;
    const bytes = Buffer.from(data, 'base64');
    if (out) {
      mkdirSync(out, { recursive: true });
      const file = join(out, `result-${index + 1}.${extension}`);
      writeFileSync(file, bytes);
      lines.push(`[${format} saved to ${file}]`);
    } else {
      lines.push(`[${format}, ${bytes.length} bytes: save it with --out DIR]`);
    }
  }
  if (result.text !== undefined) lines.push(result.text);
  else if (result.html !== undefined) lines.push('[html: see --json]');
  return lines;
}

async function readCode(words: string[], options: CodeOptions): Promise<string> {
  if (options.file) {
    if (words.length > 0)
      throw new UsageError('give the code or -f FILE, not both', 'abx code --help');
    return readFileSync(resolve(options.file), 'utf8');
  }
  if (words.length === 0 || (words.length === 1 && words[0] === '-')) {
    let text = '';
    process.stdin.setEncoding('utf8');
    for await (const chunk of process.stdin) text += chunk;
    return text;
  }
  return words.join(' ');
}

async function code(id: string, words: string[], options: CodeOptions): Promise<void> {
  const source = await readCode(words, options);
  const sandbox = await Sandbox.connect(id);
  const execution = await sandbox.runCode(source, {
    language: options.language,
    ...(options.timeout ? { timeoutMs: options.timeout } : {}),
    ...(options.json
      ? {}
      : {
          onStdout: (output) => process.stdout.write(output.line),
          onStderr: (output) => process.stderr.write(output.line),
        }),
  });
  if (options.json) {
    printJson({
      results: execution.results,
      logs: execution.logs,
      error: execution.error ?? null,
      executionCount: execution.executionCount ?? null,
    });
  } else {
    execution.results.forEach((result, index) => {
      for (const line of describeResult(result, index, options.out)) printLine(line);
    });
    if (execution.error)
      process.stderr.write(
        `${execution.error.traceback || `${execution.error.name}: ${execution.error.value}`}\n`,
      );
  }
  if (execution.error) throw new ExitCode(1);
}

/** `abx code ID [CODE...]`: a cell in the sandbox's default context of a language. */
export function addCodeCommand(program: Command): void {
  withExamples(
    program
      .command('code')
      .description(
        'Run code in the sandbox’s stateful context of a language (variables persist between calls); print its output as it comes, then its results.',
      )
      .argument('<id>', 'the sandbox')
      .argument('[code...]', 'the code; none or "-": read it from stdin')
      .option('-l, --language <language>', 'python, javascript or bash', 'python')
      .option('-f, --file <file>', 'run the code in this file')
      .option('--out <dir>', 'save images (png, jpeg, pdf) of the results in this folder')
      .option('--timeout <duration>', 'interrupt the code past this (default 60s)', durationArg)
      .option('--json', 'print the execution as JSON (results, logs, error)')
      .action(code),
    'abx code i1a2b3c4d5e6f7g8 "x = 21; x * 2"',
    'abx code i1a2b3c4d5e6f7g8 -f plot.py --out charts/',
    'echo "echo $HOME" | abx code i1a2b3c4d5e6f7g8 -l bash',
  );
}
