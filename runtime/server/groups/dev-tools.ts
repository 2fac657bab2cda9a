import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runToCompletion } from '../child-process.js';
import { BadRequestError, toolUnavailable } from '../errors.js';
import { safePath } from '../file-system.js';
import { defineGroup } from '../route-group.js';
import { argList } from '../validate.js';
import { which } from '../which.js';

/** git is run with argument lists, never through a shell; it must answer within this. */
const GIT_TIMEOUT_MS = 30_000;

async function git(cwd: string, args: string[]): Promise<string> {
  const program = await which('git');
  if (!program) throw toolUnavailable('git', 'the git routes');
  const result = await runToCompletion(program, args, {
    cwd: safePath(cwd, 'path'),
    timeoutMs: GIT_TIMEOUT_MS,
    what: `git ${args[0]}`,
  });
  if (result.exit_code !== 0) {
    throw new BadRequestError(`git ${args[0]} failed in ${cwd}: ${result.stderr.trim()}`);
  }
  return result.stdout;
}

const RUNNERS: Record<string, { program: string; file: string }> = {
  python: { program: 'python3', file: 'snippet.py' },
  node: { program: 'node', file: 'snippet.mjs' },
};

/** git inspection and running a code snippet. */
export const DEV_TOOLS = defineGroup(
  'DEV_TOOLS',
  '/dev-tools',
  'git status/diff/log, run snippets',
  [
    {
      method: 'GET',
      path: '/dev-tools/git/status',
      summary: 'Branch and changed files of the repository at `path`.',
      args: argList({ 'path?': ['str', '.'] }),
      handler: async ({ args }) => {
        const lines = (
          await git(args.path as string, ['status', '--porcelain=v1', '--branch'])
        ).split('\n');
        const head = lines[0]?.startsWith('## ') ? lines.shift()?.slice(3) : undefined;
        return {
          branch: head?.split('...')[0] ?? null,
          files: lines.filter(Boolean).map((l) => ({ status: l.slice(0, 2), path: l.slice(3) })),
        };
      },
    },
    {
      method: 'GET',
      path: '/dev-tools/git/diff',
      summary: 'Unified diff of the working tree (or the index with `staged`).',
      args: argList({ 'path?': ['str', '.'], 'staged?': ['bool', false] }),
      handler: async ({ args }) => ({
        diff: await git(args.path as string, [
          'diff',
          '--no-color',
          ...(args.staged ? ['--cached'] : []),
        ]),
      }),
    },
    {
      method: 'GET',
      path: '/dev-tools/git/log',
      summary: 'The last `limit` commits: hash, author, date, subject.',
      args: argList({ 'path?': ['str', '.'], 'limit?': ['int', 20] }),
      handler: async ({ args }) => {
        const limit = args.limit as number;
        if (limit < 1) throw new BadRequestError('limit must be at least 1');
        const out = await git(args.path as string, [
          'log',
          `-n${limit}`,
          '--format=%H%x1f%an%x1f%aI%x1f%s',
        ]);
        return {
          commits: out
            .split('\n')
            .filter(Boolean)
            .map((line) => {
              const [hash, author, date, subject] = line.split('\x1f');
              return { hash, author, date, subject };
            }),
        };
      },
    },
    {
      method: 'POST',
      path: '/dev-tools/run',
      summary:
        'Runs a `python` or `node` snippet with a `timeout` (s); 504 with partial output past it.',
      args: argList({
        language: 'str',
        code: 'str',
        'timeout?': ['float', 30],
        'cwd?': ['str', '.'],
      }),
      handler: async ({ args }) => {
        const runner = RUNNERS[args.language as string];
        if (!runner) {
          throw new BadRequestError(
            `language must be one of ${Object.keys(RUNNERS).join(', ')}, not ${JSON.stringify(args.language)}`,
          );
        }
        const seconds = args.timeout as number;
        if (seconds <= 0) throw new BadRequestError('timeout must be a positive number of seconds');
        const program = runner.program === 'node' ? process.execPath : await which(runner.program);
        if (!program) throw toolUnavailable(runner.program, `running ${args.language} snippets`);
        const dir = await mkdtemp(join(tmpdir(), 'abx-snippet-'));
        try {
          const file = join(dir, runner.file);
          await writeFile(file, args.code as string);
          return await runToCompletion(program, [file], {
            cwd: safePath(args.cwd as string, 'cwd'),
            timeoutMs: Math.round(seconds * 1000),
            what: `${args.language} snippet`,
          });
        } finally {
          await rm(dir, { recursive: true, force: true });
        }
      },
    },
  ],
);
