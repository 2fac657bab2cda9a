import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { abxHome, abxPaths } from '../control/paths.js';
import { findDaemon, startDaemon, stopDaemon } from '../sandbox/daemon-connection.js';

/** `abx daemon start|stop|status|logs`. */
export function addDaemonCommand(program: Command): void {
  const daemon = program
    .command('daemon')
    .description(
      'Manage the local control plane (API, gateway, reaper); the SDK starts it on demand.',
    )
    .addHelpText('after', '\nExample:\n  abx daemon status --json');

  daemon
    .command('start')
    .description('Start the daemon in the background (no-op when one runs).')
    .option('--json', 'print the daemon info as JSON')
    .action(async (options: { json?: boolean }) => {
      const info = await startDaemon(abxHome());
      process.stdout.write(
        options.json
          ? `${JSON.stringify(info)}\n`
          : `daemon ${info.pid} listening: API ${info.apiUrl}, gateway ${info.gatewayUrl}\n`,
      );
    });

  daemon
    .command('stop')
    .description('Stop the daemon; sandboxes keep running and are adopted by the next one.')
    .action(async () => {
      const stopped = await stopDaemon(abxHome());
      process.stdout.write(stopped ? 'daemon stopped\n' : 'no daemon was running\n');
    });

  daemon
    .command('status')
    .description('Whether a daemon runs, and where.')
    .option('--json', 'print the daemon info as JSON (null when none runs)')
    .action(async (options: { json?: boolean }) => {
      const info = await findDaemon(abxHome());
      if (options.json) process.stdout.write(`${JSON.stringify(info ?? null)}\n`);
      else if (info) {
        process.stdout.write(
          `running: pid ${info.pid}, API ${info.apiUrl}, gateway ${info.gatewayUrl}, since ${info.startedAt}\n`,
        );
      } else process.stdout.write(`not running (home ${abxHome()})\n`);
      if (!info) process.exitCode = 1;
    });

  daemon
    .command('logs')
    .description("Print the daemon's log.")
    .option('-n, --lines <n>', 'only the last n lines', (v) => Number.parseInt(v, 10))
    .action((options: { lines?: number }) => {
      let text = '';
      try {
        text = readFileSync(abxPaths().daemonLog, 'utf8');
      } catch {
        // no log yet
      }
      const lines = text.split('\n');
      process.stdout.write(options.lines ? lines.slice(-options.lines - 1).join('\n') : text);
    });
}
