import { readFileSync } from 'node:fs';
import { join } from 'node:path';
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
