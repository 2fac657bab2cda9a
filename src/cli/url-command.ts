import type { Command } from 'commander';
import { Sandbox } from '../sandbox/sandbox.js';
import { durationArg, portArg, withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface UrlOptions {
  expires?: number;
  session?: number;
  path?: string;
  json?: boolean;
}

async function url(id: string, port: number, options: UrlOptions): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  const path = options.path ?? '/';
  const expiresInMs = options.expires ?? 60_000;
  const signedUrl = await sandbox.getSignedUrl(port, {
    path,
    expiresInMs,
    ...(options.session === undefined ? {} : { sessionMs: options.session }),
  });
  const apiUrl = `${sandbox.getUrl(port)}${path === '/' ? '/' : path}`;
  if (options.json) {
    return printJson({
      url: apiUrl,
      signedUrl,
      expiresAt: new Date(Date.now() + expiresInMs).toISOString(),
    });
  }
  printLine(`open in a browser (once, within ${Math.round(expiresInMs / 1000)} s): ${signedUrl}`);
  printLine(
    `from code or curl, with the sandbox's access token: curl -H "X-Access-Token: $TOKEN" ${apiUrl}`,
  );
}

/** `abx url ID PORT`: a port of a sandbox, for a browser (a one-time link) and for code. */
export function addUrlCommand(program: Command): void {
  withExamples(
    program
      .command('url')
      .description(
        "Print a one-time link that opens a port of the sandbox in a browser (it sets a cookie for that port and drops the link from the address bar), and the port's URL for code and curl, which take the sandbox's access token as X-Access-Token (the template needs the ports capability).",
      )
      .argument('<id>', 'the sandbox')
      .argument('<port>', 'the port inside the sandbox', portArg)
      .option('--path <path>', 'where on the port the link leads', '/')
      .option(
        '--expires <duration>',
        'how long the link can be opened (default 60s, at most 1h)',
        durationArg,
      )
      .option(
        '--session <duration>',
        "how long the browser's cookie lasts (default 1h, at most 24h)",
        durationArg,
      )
      .option('--json', 'print { url, signedUrl, expiresAt }')
      .action(url),
    'abx url i1a2b3c4d5e6f7g8 3000',
    'abx url i1a2b3c4d5e6f7g8 8080 --path /commands --expires 5m --json',
  );
}
