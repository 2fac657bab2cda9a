import { spawn } from 'node:child_process';
import type { Command } from 'commander';
import { connectControlPlane } from '../installation/control-connection.js';
import { daemonClient } from '../sandbox/http-client.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface DashboardOptions {
  open?: boolean;
  json?: boolean;
}

/** The program that opens a URL in the user's browser here, when there is a desktop to open it on. */
function opener(): string | undefined {
  if (process.platform === 'darwin') return 'open';
  if (process.platform === 'win32') return undefined;
  return process.env.DISPLAY || process.env.WAYLAND_DISPLAY ? 'xdg-open' : undefined;
}

async function dashboard(options: DashboardOptions): Promise<void> {
  const connection = await connectControlPlane();
  const client = daemonClient(connection, 30_000);
  const link = await client.json<{ url: string; expiresAt: string }>('POST', '/ui/links', {
    body: {},
  });
  if (options.json) return printJson(link);
  const seconds = Math.max(1, Math.round((Date.parse(link.expiresAt) - Date.now()) / 1000));
  const program = options.open === false ? undefined : opener();
  if (program) {
    // Detached and silent: the browser outlives this command, its messages are not ours.
    const child = spawn(program, [link.url], { detached: true, stdio: 'ignore' });
    child.on('error', () => undefined);
    child.unref();
    printLine(
      `opening the dashboard in your browser; if it does not open, use this link (once, within ${seconds} s):`,
    );
  } else {
    printLine(`open the dashboard with this link (once, within ${seconds} s):`);
  }
  printLine(link.url);
}

/** `abx dashboard`: a one-time sign-in link to the daemon's web dashboard. */
export function addDashboardCommand(program: Command): void {
  withExamples(
    program
      .command('dashboard')
      .description(
        "Open the daemon's web dashboard (sandboxes, terminals, files, templates, keys) signed in with this CLI's key: it makes a one-time link that sets an HttpOnly session cookie and drops the code from the address bar. Opens the browser when there is a desktop, else prints the link. The key itself never goes into the link.",
      )
      .option('--no-open', 'only print the link')
      .option('--json', 'print { url, expiresAt }')
      .action(dashboard),
    'abx dashboard',
    'abx daemon start --api-port 7070  # on a remote host: the API and its dashboard on 7070, kept',
    'ssh -L 7070:127.0.0.1:7070 host  # then, on the host: abx dashboard --no-open',
  );
}
