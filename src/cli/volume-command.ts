import type { Command } from 'commander';
import type { VolumeInfo } from '../../runtime/protocol/wire.js';
import { VolumeNotFoundError } from '../errors.js';
import {
  createVolume,
  getVolume,
  listVolumes,
  openControl,
  removeVolume,
} from '../sandbox/sandbox-api.js';
import { formatBytes } from './feedback.js';
import { withExamples } from './options.js';
import { ago, printFields, printJson, printLine, printTable } from './output.js';

/** `1.2 MiB of 1 GiB (enforced)`. */
function usageText(volume: VolumeInfo): string {
  if (volume.usedBytes === undefined || volume.totalBytes === undefined) {
    return formatBytes(volume.sizeBytes);
  }
  return `${formatBytes(volume.usedBytes)} of ${formatBytes(volume.totalBytes)} (${volume.quotaEnforced ? 'a quota: writes past it fail' : 'reported only: not enforced here'})`;
}

/** `abx volume create|ls|info|rm`. */
export function addVolumeCommand(program: Command): void {
  const volume = withExamples(
    program
      .command('volume')
      .description(
        'Manage volumes: storage that outlives sandboxes, mounted with abx create --volume NAME:PATH. Each API key has its own.',
      ),
    'abx volume create data --size 2G',
    'abx create --volume data:/mnt/data',
    'abx volume rm data',
  );

  withExamples(
    volume
      .command('create <name>')
      .description('Make an empty volume (letters, digits, _ and -).')
      .option('--size <size>', 'its size, a quota: bytes, or 512M, 2G (16M to 1T)', '1G')
      .option('--json', 'print it as JSON')
      .action(async (name: string, options: { size: string; json?: boolean }) => {
        const { client } = await openControl();
        const made = await createVolume(client, name, options.size);
        if (options.json) return printJson(made);
        printLine(`made volume ${made.name} (${formatBytes(made.sizeBytes)})`);
      }),
    'abx volume create data',
    'abx volume create models --size 20G',
  );

  withExamples(
    volume
      .command('ls')
      .alias('list')
      .description('List your volumes.')
      .option('--json', 'print them as JSON')
      .action(async (options: { json?: boolean }) => {
        const { client } = await openControl();
        const volumes = await listVolumes(client);
        if (options.json) return printJson(volumes);
        if (volumes.length === 0) {
          process.stderr.write('no volumes: make one with abx volume create NAME\n');
          return;
        }
        printTable(
          ['NAME', 'SIZE', 'CREATED', 'ID'],
          volumes.map((v) => [v.name, formatBytes(v.sizeBytes), ago(v.createdAt), v.volumeId]),
        );
      }),
    'abx volume ls --json',
  );

  withExamples(
    volume
      .command('info <name>')
      .description('Show a volume: what it holds and the sandboxes that mount it.')
      .option('--json', 'print it as JSON')
      .action(async (name: string, options: { json?: boolean }) => {
        const { client } = await openControl();
        const info = await getVolume(client, name);
        if (options.json) return printJson(info);
        printFields([
          ['name', info.name],
          ['id', info.volumeId],
          ['used', usageText(info)],
          ['created', `${info.createdAt} (${ago(info.createdAt)})`],
          ['mounted by', (info.usedBy ?? []).join(', ') || '-'],
        ]);
      }),
    'abx volume info data',
  );

  withExamples(
    volume
      .command('rm <names...>')
      .alias('remove')
      .description(
        'Remove volumes and every file in them. Refused while a running or paused sandbox mounts one.',
      )
      .action(async (names: string[]) => {
        const { client } = await openControl();
        for (const name of names) {
          if (!(await removeVolume(client, name))) {
            throw new VolumeNotFoundError(`no volume named ${name} (abx volume ls lists yours)`);
          }
          printLine(`removed volume ${name}`);
        }
      }),
    'abx volume rm data',
  );
}
