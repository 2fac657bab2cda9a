import { constants } from 'node:fs';
import { access, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runToCompletion } from '../child-process.js';
import { BadRequestError, BrowserUnavailableError } from '../errors.js';
import { defineGroup } from '../route-group.js';
import { argList } from '../validate.js';

/** Flags for a one-shot headless run that phones nowhere and leaves no state behind. */
const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

const URL_SCHEMES = ['http:', 'https:', 'file:', 'data:'];

function checkUrl(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new BadRequestError(
      `url ${JSON.stringify(text)} is not an absolute URL such as https://example.com`,
    );
  }
  if (!URL_SCHEMES.includes(url.protocol)) {
    throw new BadRequestError(
      `url scheme ${url.protocol} is not supported; use ${URL_SCHEMES.join(', ')}`,
    );
  }
  return url.href;
}

/** Runs Chromium once with a fresh profile directory, removed afterwards. */
async function chromium<T>(
  path: string,
  seconds: number,
  args: (dir: string) => string[],
  read: (dir: string, stdout: string) => Promise<T>,
): Promise<T> {
  try {
    await access(path, constants.X_OK);
  } catch {
    throw new BrowserUnavailableError(
      `no headless browser is available: ${path} does not exist; install chromium in the sandbox template to use /browser routes`,
    );
  }
  if (seconds <= 0) throw new BadRequestError('timeout must be a positive number of seconds');
  const dir = await mkdtemp(join(tmpdir(), 'abx-browser-'));
  try {
    const result = await runToCompletion(
      path,
      [...CHROMIUM_FLAGS, `--user-data-dir=${join(dir, 'profile')}`, ...args(dir)],
      {
        timeoutMs: Math.round(seconds * 1000),
        what: 'chromium',
      },
    );
    if (result.exit_code !== 0) {
      throw new BadRequestError(
        `chromium failed (exit ${result.exit_code}): ${result.stderr.trim().slice(-2000)}`,
      );
    }
    return await read(dir, result.stdout);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const ENTITIES: Record<string, string> = {
  amp: '&',
  lt: '<',
  gt: '>',
  quot: '"',
  '#39': "'",
  nbsp: ' ',
};

/** The visible text of serialized DOM: no scripts, styles or tags; whitespace collapsed. */
function textOf(html: string): string {
  return html
    .replace(/<(script|style|noscript|template)\b[\s\S]*?<\/\1>/gi, ' ')
    .replace(/<[^>]+>/g, ' ')
    .replace(/&(amp|lt|gt|quot|#39|nbsp);/g, (_, name: string) => ENTITIES[name] ?? '')
    .replace(/\s+/g, ' ')
    .trim();
}

/** Page screenshots and DOM text through headless Chromium, when the sandbox has it. */
export const BROWSER = defineGroup('BROWSER', '/browser', 'headless Chromium screenshot and text', [
  {
    method: 'POST',
    path: '/browser/screenshot',
    summary: 'PNG screenshot of `url` at `width`×`height`, base64; 503 when Chromium is missing.',
    args: argList({
      url: 'str',
      'width?': ['int', 1280],
      'height?': ['int', 800],
      'timeout?': ['float', 30],
    }),
    handler: ({ args, ctx }) => {
      const url = checkUrl(args.url as string);
      return chromium(
        ctx.chromiumPath,
        args.timeout as number,
        (dir) => [
          `--screenshot=${join(dir, 'shot.png')}`,
          `--window-size=${args.width},${args.height}`,
          url,
        ],
        async (dir) => {
          const png = await readFile(join(dir, 'shot.png'));
          return {
            content: png.toString('base64'),
            encoding: 'base64',
            mime: 'image/png',
            size: png.length,
          };
        },
      );
    },
  },
  {
    method: 'POST',
    path: '/browser/text',
    summary: 'Text and HTML size of the rendered DOM of `url`; 503 when Chromium is missing.',
    args: argList({ url: 'str', 'timeout?': ['float', 30] }),
    handler: ({ args, ctx }) => {
      const url = checkUrl(args.url as string);
      return chromium(
        ctx.chromiumPath,
        args.timeout as number,
        () => ['--dump-dom', url],
        async (_, html) => ({
          url,
          text: textOf(html),
          html_size: Buffer.byteLength(html),
        }),
      );
    },
  },
]);
