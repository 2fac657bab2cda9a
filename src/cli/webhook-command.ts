import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { WebhookNotFoundError } from '../errors.js';
import { Webhook, type WebhookInfo, type WebhookOptions } from '../sandbox/webhook.js';
import { UsageError } from './errors.js';
import { withExamples } from './options.js';
import { ago, printFields, printJson, printLine, printTable } from './output.js';

interface SecretOptions {
  secretStdin?: boolean;
  secretFile?: string;
}

const collect = (value: string, previous: string[] = []) => [...previous, value];

/** The signing secret from stdin or a file (never the command line: ps and history show it). */
async function readSecret(options: SecretOptions): Promise<string | undefined> {
  if (options.secretStdin && options.secretFile !== undefined) {
    throw new UsageError('give the secret one way: --secret-stdin or --secret-file, not both');
  }
  if (options.secretFile !== undefined) {
    try {
      return readFileSync(options.secretFile, 'utf8').replace(/\r?\n$/, '');
    } catch (error) {
      throw new UsageError(
        `cannot read ${options.secretFile}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
      );
    }
  }
  if (!options.secretStdin) return undefined;
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks)
    .toString('utf8')
    .replace(/\r?\n$/, '');
}

function addSecretOptions(command: Command): Command {
  return command
    .option('--secret-stdin', 'read the signing secret from stdin (8 to 1024 characters)')
    .option('--secret-file <file>', 'read the signing secret from a file');
}

const eventsText = (hook: WebhookInfo) => (hook.events.length ? hook.events.join(',') : 'all');

/** `abx webhook create|list|info|update|delete|deliveries`. */
export function addWebhookCommand(program: Command): void {
  const webhook = withExamples(
    program
      .command('webhook')
      .description(
        "Manage webhooks: your key's sandboxes' lifecycle events POSTed to a URL as they happen, signed (abx-webhook-signature, checked with verifyWebhook), retried with backoff for up to a day. docs/events.md.",
      ),
    'abx webhook create https://example.com/abx --event sandbox.lifecycle.killed',
    'abx webhook deliveries whk_0123456789abcdef0123',
  );

  withExamples(
    addSecretOptions(
      webhook
        .command('create <url>')
        .description(
          'Register a webhook (http or https; loopback, private and metadata addresses are refused unless the daemon permits them). Without a secret option abx makes one and prints it this once.',
        ),
    )
      .option('--name <name>', 'its name (default: the URL host)')
      .option('--event <type>', 'an event type it gets (repeatable; default: all)', collect)
      .option('--disabled', 'register it without delivering yet')
      .option('--json', 'print it as JSON')
      .action(
        async (
          url: string,
          options: SecretOptions & {
            name?: string;
            event?: string[];
            disabled?: boolean;
            json?: boolean;
          },
        ) => {
          const secret = await readSecret(options);
          const made = await Webhook.create(url, {
            ...(options.name === undefined ? {} : { name: options.name }),
            ...(options.event ? { events: options.event } : {}),
            ...(options.disabled ? { enabled: false } : {}),
            ...(secret === undefined ? {} : { secret }),
          });
          if (options.json) return printJson(made);
          printLine(`made webhook ${made.id} → ${made.url} (events: ${eventsText(made)})`);
          if (made.secret) {
            printLine(`signing secret (shown this once, keep it): ${made.secret}`);
          }
        },
      ),
    'abx webhook create https://example.com/abx',
    'openssl rand -base64 32 | abx webhook create https://example.com/abx --secret-stdin',
  );

  withExamples(
    webhook
      .command('list')
      .alias('ls')
      .description(
        "List your webhooks (an admin key: every key's, with the owner); never a secret.",
      )
      .option('--json', 'print them as JSON')
      .action(async (options: { json?: boolean }) => {
        const hooks = await Webhook.list();
        if (options.json) return printJson(hooks);
        if (hooks.length === 0) {
          process.stderr.write('no webhooks: register one with abx webhook create URL\n');
          return;
        }
        const owners = hooks.some((h) => h.owner !== undefined);
        printTable(
          ['ID', 'NAME', 'URL', 'ENABLED', 'EVENTS', 'FACE', ...(owners ? ['OWNER'] : [])],
          hooks.map((h) => [
            h.id,
            h.name,
            h.url,
            h.enabled ? 'yes' : 'no',
            eventsText(h),
            h.flavour,
            ...(owners ? [h.owner ?? '(daemon key)'] : []),
          ]),
        );
      }),
    'abx webhook list --json',
  );

  withExamples(
    addSecretOptions(
      webhook.command('update <id>').description('Change a webhook; what is not given is kept.'),
    )
      .option('--url <url>', 'its new URL')
      .option('--name <name>', 'its new name')
      .option('--event <type>', 'the event types it gets from now on (repeatable)', collect)
      .option('--all-events', 'every event type from now on')
      .option('--enable', 'deliver again')
      .option('--disable', 'stop delivering (events meanwhile are not sent later)')
      .option('--json', 'print it as JSON')
      .action(
        async (
          id: string,
          options: SecretOptions & {
            url?: string;
            name?: string;
            event?: string[];
            allEvents?: boolean;
            enable?: boolean;
            disable?: boolean;
            json?: boolean;
          },
        ) => {
          if (options.enable && options.disable) {
            throw new UsageError('give --enable or --disable, not both');
          }
          if (options.event && options.allEvents) {
            throw new UsageError('give --event or --all-events, not both');
          }
          const secret = await readSecret(options);
          const change: WebhookOptions & { url?: string } = {
            ...(options.url === undefined ? {} : { url: options.url }),
            ...(options.name === undefined ? {} : { name: options.name }),
            ...(options.event ? { events: options.event } : {}),
            ...(options.allEvents ? { events: [] } : {}),
            ...(options.enable ? { enabled: true } : {}),
            ...(options.disable ? { enabled: false } : {}),
            ...(secret === undefined ? {} : { secret }),
          };
          if (Object.keys(change).length === 0) {
            throw new UsageError(
              'nothing to change: give --url, --name, --event, --all-events, --enable, --disable or a secret option',
              'abx webhook update --help',
            );
          }
          const updated = await Webhook.update(id, change);
          if (options.json) return printJson(updated);
          printLine(
            `updated webhook ${updated.id} → ${updated.url} (${updated.enabled ? 'enabled' : 'disabled'}, events: ${eventsText(updated)})`,
          );
        },
      ),
    'abx webhook update whk_0123456789abcdef0123 --disable',
  );

  withExamples(
    webhook
      .command('delete <ids...>')
      .alias('rm')
      .description('Remove webhooks and their delivery logs.')
      .action(async (ids: string[]) => {
        for (const id of ids) {
          if (!(await Webhook.destroy(id))) {
            throw new WebhookNotFoundError(`no webhook ${id} (abx webhook list lists yours)`);
          }
          printLine(`removed webhook ${id}`);
        }
      }),
    'abx webhook delete whk_0123456789abcdef0123',
  );

  withExamples(
    webhook
      .command('deliveries <id>')
      .description(
        "A webhook's delivery log, newest event first: each delivery's id (the same on every retry), state, attempts, last status and error.",
      )
      .option('--limit <n>', 'at most this many (1 to 500; default 100)')
      .option('--json', 'print them as JSON')
      .action(async (id: string, options: { limit?: string; json?: boolean }) => {
        const info = await Webhook.getInfo(id);
        const deliveries = await Webhook.deliveries(id, {
          ...(options.limit === undefined ? {} : { limit: Number(options.limit) }),
        });
        if (options.json) return printJson(deliveries);
        printFields([
          ['webhook', `${info.id} → ${info.url}`],
          ['enabled', info.enabled ? 'yes' : 'no'],
        ]);
        if (deliveries.length === 0) {
          printLine('no deliveries yet');
          return;
        }
        printTable(
          ['DELIVERY', 'SANDBOX', 'STATE', 'ATTEMPTS', 'STATUS', 'WHEN', 'LAST ERROR'],
          deliveries.map((d) => [
            d.id,
            d.sandboxId,
            d.state,
            String(d.attempts),
            d.lastStatus === null ? '-' : String(d.lastStatus),
            ago(d.deliveredAt ?? d.createdAt),
            d.lastError ?? '-',
          ]),
        );
      }),
    'abx webhook deliveries whk_0123456789abcdef0123 --json',
  );
}
