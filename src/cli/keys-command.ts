import { type Command, InvalidArgumentError } from 'commander';
import { ApiKeys } from '../sandbox/api-keys.js';
import { withExamples } from './options.js';
import { ago, printJson, printLine, printTable } from './output.js';

/** Parses `--max-running`: a whole number ≥ 1. */
function countArg(value: string): number {
  const count = Number(value);
  if (!/^\d+$/.test(value) || count < 1) {
    throw new InvalidArgumentError('expected a whole number of sandboxes, 1 or more.');
  }
  return count;
}

/** Parses `--format`: abx or e2b. */
function formatArg(value: string): 'abx' | 'e2b' {
  if (value !== 'abx' && value !== 'e2b') {
    throw new InvalidArgumentError('expected abx (abx_…, the default) or e2b (e2b_ and hex).');
  }
  return value;
}

/** `abx keys create|list|revoke`. */
export function addKeysCommand(program: Command): void {
  const keys = withExamples(
    program
      .command('keys')
      .description(
        "Manage the control plane's API keys (needs an admin key). A key that is not an admin sees and controls only the sandboxes it created.",
      ),
    'abx keys create --name ci --max-running 5',
    'ABX_API_URL=https://abx.example.com:8443 ABX_API_KEY=... abx keys list',
  );

  withExamples(
    keys
      .command('create')
      .description('Make an API key and print it: it is shown this once, only its hash is stored.')
      .requiredOption('--name <name>', 'what the key is for (letters, digits, . _ @ -), unique')
      .option('--admin', 'the key sees every sandbox, builds templates and manages keys')
      .option('--max-running <n>', 'the most sandboxes the key may have running at once', countArg)
      .option(
        '--format <format>',
        "the key's spelling: abx (abx_…, the default) or e2b (e2b_ and hex, which E2B's SDKs accept as E2B_API_KEY)",
        formatArg,
      )
      .option('--json', 'print the key and its record as JSON')
      .action(
        async (options: {
          name: string;
          admin?: boolean;
          maxRunning?: number;
          format?: 'abx' | 'e2b';
          json?: boolean;
        }) => {
          const created = await ApiKeys.create(options.name, {
            admin: options.admin === true,
            ...(options.maxRunning === undefined ? {} : { maxRunning: options.maxRunning }),
            ...(options.format === undefined ? {} : { format: options.format }),
          });
          if (options.json) return printJson(created);
          printLine(created.key);
          const clients =
            options.format === 'e2b'
              ? 'E2B SDKs send it as E2B_API_KEY, abx clients as ABX_API_KEY'
              : 'clients send it as ABX_API_KEY';
          process.stderr.write(
            `made API key '${created.name}' (${created.id}${created.admin ? ', admin' : ''}${created.maxRunning === null ? '' : `, at most ${created.maxRunning} running`}): keep it now, it is not shown again; ${clients}\n`,
          );
        },
      ),
    'abx keys create --name alice',
    'abx keys create --name ci --max-running 5 --json',
    'abx keys create --name ops --admin',
    'abx keys create --name agents --format e2b   # for E2B_API_KEY',
  );

  withExamples(
    keys
      .command('list')
      .alias('ls')
      .description(
        'List the API keys, revoked ones too: id, name, prefix, admin, limit and sandboxes running now.',
      )
      .option('--json', 'print JSON')
      .action(async (options: { json?: boolean }) => {
        const list = await ApiKeys.list();
        if (options.json) return printJson(list);
        printTable(
          ['ID', 'NAME', 'PREFIX', 'ADMIN', 'RUNNING', 'LIMIT', 'CREATED', 'LAST USED', 'REVOKED'],
          list.map((key) => [
            key.id,
            key.name,
            `${key.prefix}…`,
            key.admin ? 'yes' : 'no',
            String(key.running ?? 0),
            key.maxRunning === null ? '-' : String(key.maxRunning),
            ago(key.createdAt),
            key.lastUsedAt === null ? 'never' : ago(key.lastUsedAt),
            key.revokedAt === null ? '-' : ago(key.revokedAt),
          ]),
        );
      }),
    'abx keys list',
    'abx keys list --json | jq -r ".[] | select(.revokedAt == null) | .name"',
  );

  withExamples(
    keys
      .command('revoke <id>')
      .description(
        'Revoke an API key (by its id, key_…): refused from its next request on, on every replica. Its sandboxes run on until they end, unless --kill.',
      )
      .option(
        '--kill',
        "also kill the key's running and paused sandboxes: their tokens stop working at the gateway at once",
      )
      .option('--json', 'print JSON')
      .action(async (id: string, options: { json?: boolean; kill?: boolean }) => {
        const result = await ApiKeys.revoke(id, { kill: options.kill === true });
        if (options.json) return printJson(result);
        printLine(
          result.revoked
            ? `revoked API key '${result.key.name}' (${result.key.id})`
            : `API key '${result.key.name}' (${result.key.id}) was revoked already, ${ago(result.key.revokedAt as string)}`,
        );
        if (result.killed) {
          printLine(
            result.killed.length === 0
              ? 'it had no running or paused sandboxes'
              : `killed its ${result.killed.length} sandbox${result.killed.length === 1 ? '' : 'es'}: ${result.killed.join(' ')}`,
          );
        }
      }),
    'abx keys revoke key_3kq9x0m2ab7c',
    'abx keys revoke key_3kq9x0m2ab7c --kill   # and end its sandboxes now',
  );
}
