import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CLI } from '../cli/abx.js';
import { ROOT } from './build.js';

/** A fenced code block of README.md: its language, its text, and the heading it stands under. */
export interface ReadmeBlock {
  lang: string;
  code: string;
  heading: string;
  /** 1-based line of the opening fence, for messages. */
  line: number;
}

/** Every fenced block of the README, in order. */
export function readmeBlocks(file = join(ROOT, 'README.md')): ReadmeBlock[] {
  const lines = readFileSync(file, 'utf8').split('\n');
  const blocks: ReadmeBlock[] = [];
  let heading = '';
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] as string;
    // The info string whole: ```ts fragment is not a ```ts block.
    const fence = /^```(\S*(?: \S+)*)\s*$/.exec(line);
    if (!fence) {
      if (/^#+ /.test(line)) heading = line.replace(/^#+ /, '');
      continue;
    }
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i] as string); i++) {
      body.push(lines[i] as string);
    }
    blocks.push({ lang: fence[1] ?? '', code: `${body.join('\n')}\n`, heading, line: start + 1 });
  }
  return blocks;
}

/**
 * The README block of `lang` under the heading that starts with `heading` (the first one, or the
 * one whose text includes `containing`). Throws, naming what it looked for, when the README has
 * none: a test of a README example then fails, not passes, when the example goes.
 */
export function readmeBlock(lang: string, heading: string, containing?: string): ReadmeBlock {
  const found = readmeBlocks().find(
    (b) =>
      b.lang === lang &&
      b.heading.startsWith(heading) &&
      (containing === undefined || b.code.includes(containing)),
  );
  if (!found) {
    throw new Error(
      `README.md has no \`\`\`${lang} block under a heading starting with '${heading}'${containing ? ` that contains '${containing}'` : ''}`,
    );
  }
  return found;
}

/** One `$ command` of a console session and the output the README shows after it. */
export interface SessionStep {
  command: string;
  output: string[];
}

/** Splits a ```console block into its commands and their shown output. */
export function sessionSteps(block: ReadmeBlock): SessionStep[] {
  const steps: SessionStep[] = [];
  for (const line of block.code.trimEnd().split('\n')) {
    if (line.startsWith('$ ')) steps.push({ command: line.slice(2), output: [] });
    else steps.at(-1)?.output.push(line);
  }
  return steps;
}

/**
 * A ```console block typed into bash in `cwd`, one command after another as a person would, with
 * `abx` this checkout's CLI: each step's output (stdout and stderr), and what bash itself wrote on
 * stderr (nothing, when every command ran). A marker line goes before each command, with the
 * previous command's status kept for an `echo $?` that may follow.
 */
export function runSession(
  block: ReadmeBlock,
  cwd: string,
  env: NodeJS.ProcessEnv,
  timeoutMs = 240_000,
): { steps: SessionStep[]; outputs: string[]; stdout: string; stderr: string } {
  const steps = sessionSteps(block);
  const script = [
    `abx() { ${JSON.stringify(process.execPath)} ${JSON.stringify(CLI)} "$@"; }`,
    ...steps.flatMap((step, i) => [
      `__status=$?; printf '\\n@@step ${i}\\n'; (exit $__status)`,
      // On a line of its own: a trailing `# comment` of the README ends before the redirection.
      `{ ${step.command}\n} 2>&1`,
    ]),
  ].join('\n');
  // Outside `cwd`: the session may show that folder (a workspace's git status).
  const dir = mkdtempSync(join(tmpdir(), 'abx-readme-session-'));
  const file = join(dir, 'session.sh');
  writeFileSync(file, script);
  const run = spawnSync('bash', [file], {
    cwd,
    encoding: 'utf8',
    env: { ...process.env, NO_COLOR: '1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: timeoutMs,
  });
  rmSync(dir, { recursive: true, force: true });
  const outputs = run.stdout.split(/\n?@@step \d+\n/).slice(1);
  return { steps, outputs, stdout: run.stdout, stderr: run.stderr };
}

/** A step's output as lines, the way the README shows it (an empty output is no line). */
export function outputLines(output: string | undefined): string[] {
  return (output ?? '')
    .trimEnd()
    .split('\n')
    .filter((line, n, all) => all.length > 1 || line !== '');
}
