import type { Command } from 'commander';
import { ServerNotRunningError } from '../errors.js';
import { Sandbox } from '../sandbox/sandbox.js';
import { ExitCode } from './errors.js';
import { withSpinner } from './feedback.js';
import { collect, durationArg, portArg, withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface StartOptions {
  port: number;
  module?: string[];
  restart?: boolean;
  commandTimeout?: number;
  json?: boolean;
}

async function start(id: string, options: StartOptions): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  await withSpinner('starting the command server', () =>
    sandbox.server.start({
      port: options.port,
      modules: options.module ?? [],
      ...(options.restart ? { restart: true } : {}),
      ...(options.commandTimeout ? { commandTimeoutMs: options.commandTimeout } : {}),
    }),
  );
  const status = {
    running: true,
    url: sandbox.server.url,
    commands: await sandbox.server.commands(),
  };
  if (options.json) return printJson(status);
  printLine(`command server running at ${status.url}`);
  printLine(`commands: ${status.commands.map((c) => c.name).join(', ') || '(none)'}`);
}

async function status(id: string, options: { json?: boolean; port: number }): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  await sandbox.server.attach(options.port);
  let commands: Awaited<ReturnType<typeof sandbox.server.commands>> | undefined;
  try {
    commands = await sandbox.server.commands();
  } catch (error) {
    if (!(error instanceof ServerNotRunningError)) throw error;
  }
  if (options.json) {
    printJson(commands ? { running: true, url: sandbox.server.url, commands } : { running: false });
  } else if (commands) {
    printLine(
      `running at ${sandbox.server.url}; commands: ${commands.map((c) => c.name).join(', ') || '(none)'}`,
    );
  } else {
    printLine(`no command server runs in sandbox ${id} on port ${options.port}`);
  }
  // Like `daemon status`: scripts can test for a running server with the exit code.
  if (!commands) throw new ExitCode(1);
}

/** `abx server start|status|stop`: the command server in a sandbox. */
export function addServerCommand(program: Command): void {
  const server = withExamples(
    program
      .command('server')
      .description(
        'Start, inspect and stop the command server that serves decorated commands in a sandbox.',
      ),
    'abx server start i1a2b3c4d5e6f7g8 --module build/data-tools.js',
  );

  withExamples(
    server
      .command('start')
      .description(
        'Bundle the decorated classes of the modules, start the server in the sandbox and wait until it answers (the template needs the ports capability).',
      )
      .argument('<id>', 'the sandbox')
      .option(
        '-m, --module <file>',
        'a module (JS or TS) with @sandbox classes (repeatable)',
        collect,
      )
      .option('-p, --port <port>', 'port inside the sandbox', portArg, 8080)
      .option('--restart', 'stop a server already running there and start again')
      .option('--command-timeout <duration>', 'default time limit of one command call', durationArg)
      .option('--json', 'print the server as JSON')
      .action(start),
    'abx server start i1a2b3c4d5e6f7g8 --module samples/build/data-tools.js --port 8080',
  );

  withExamples(
    server
      .command('status')
      .description(
        'Whether a command server runs, where, and what it serves; exits 1 when none runs.',
      )
      .argument('<id>', 'the sandbox')
      .option('-p, --port <port>', 'port inside the sandbox', portArg, 8080)
      .option('--json', 'print JSON')
      .action(status),
    'abx server status i1a2b3c4d5e6f7g8 --json',
  );

  withExamples(
    server
      .command('stop')
      .description('Stop the command server; calls in flight finish first.')
      .argument('<id>', 'the sandbox')
      .option('-p, --port <port>', 'port inside the sandbox', portArg, 8080)
      .action(async (id: string, options: { port: number }) => {
        const sandbox = await Sandbox.connect(id);
        if (!(await sandbox.server.attach(options.port))) {
          printLine(`no command server runs in sandbox ${id} on port ${options.port}`);
          return;
        }
        await sandbox.server.stop();
        printLine(`command server of ${id} on port ${options.port} stopped`);
      }),
    'abx server stop i1a2b3c4d5e6f7g8',
  );
}
