import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { WebhookNotFoundError } from '../errors.js';
import {
  Webhook,
  type WebhookDelivery,
  type WebhookInfo,
  type WebhookOptions,
} from '../sandbox/webhook.js';
import { EXIT, ExitCode, UsageError } from './errors.js';
import { durationArg, withExamples } from './options.js';
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

/** How long `abx webhook test` and `redeliver` wait for an outcome by default. */
const WAIT_DEFAULT_MS = 30_000;

/**
 * Waits for a delivery's outcome (unless `wait` is false) and prints it; exit 1 when it failed
 * or was still pending when the wait ended.
 */
async function reportDelivery(
  id: string,
  queued: WebhookDelivery,
  options: { wait: boolean; timeout?: number; json?: boolean },
  what: string,
): Promise<void> {
  const timeout = options.timeout ?? WAIT_DEFAULT_MS;
  if (!options.wait) {
    if (options.json) return printJson(queued);
    printLine(`${what}: delivery ${queued.id} queued (abx webhook deliveries ${id} shows it)`);
    return;
  }
  const delivery = await Webhook.waitForDelivery(id, queued.id, { timeoutMs: timeout });
  if (options.json) printJson(delivery);
  else {
    const attempts = `${delivery.attempts} attempt${delivery.attempts === 1 ? '' : 's'}`;
    const status = delivery.lastStatus === null ? 'no HTTP status' : `HTTP ${delivery.lastStatus}`;
    if (delivery.state === 'delivered') {
      printLine(`${what}: delivery ${delivery.id} delivered (${status}, ${attempts})`);
    } else if (delivery.state === 'failed') {
      printLine(`${what}: delivery ${delivery.id} failed (${status}, ${attempts})`);
      printLine(`error: ${delivery.lastError ?? '(none recorded)'}`);
    } else {
      printLine(
        `${what}: delivery ${delivery.id} still pending after ${Math.round(timeout / 1000)} s (${attempts}${delivery.lastError ? `; last error: ${delivery.lastError}` : ''}); abx webhook deliveries ${id} shows how it ends`,
      );
    }
  }
  if (delivery.state !== 'delivered') throw new ExitCode(EXIT.error);
}

/** `abx webhook create|list|update|delete|deliveries|test|redeliver`. */
export function addWebhookCommand(program: Command): void {
  const webhook = withExamples(
    program
      .command('webhook')
      .description(
        "Manage webhooks: your key's sandboxes' lifecycle events POSTed to a URL as they happen, signed (abx-webhook-signature, checked with verifyWebhook), retried with backoff for up to a day. docs/events.md.",
      ),
    'abx webhook create https://example.com/abx --event sandbox.lifecycle.killed',
    'abx webhook deliveries whk_0123456789abcdef0123',
    'abx webhook test whk_0123456789abcdef0123',
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
            d.kind === 'test' ? '(test)' : d.sandboxId,
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

  withExamples(
    webhook
      .command('test <id>')
      .description(
        `Send one webhook a ${'webhook.test'} event (no sandbox changed), signed as its other deliveries and tried once, then wait for the outcome and print it: delivered with the receiver's HTTP status, or failed with its status or error (exit 1). The delivery is in the webhook's log (abx webhook deliveries). A disabled webhook is refused: enable it first.`,
      )
      .option('--no-wait', 'print the queued delivery id and return at once')
      .option(
        '--timeout <duration>',
        'wait at most this long for the outcome (default 30s; the attempt itself ends within ABX_WEBHOOK_TIMEOUT_MS, 10s)',
        durationArg,
      )
      .option('--json', 'print the delivery as JSON')
      .action(async (id: string, options: { wait: boolean; timeout?: number; json?: boolean }) => {
        const queued = await Webhook.test(id);
        await reportDelivery(id, queued, options, 'test');
      }),
    'abx webhook test whk_0123456789abcdef0123 --timeout 1m',
  );

  withExamples(
    webhook
      .command('redeliver <id> <deliveryId>')
      .description(
        "Send a delivered or failed delivery again: the same delivery id (abx-webhook-id) and event, so a receiver that has it already deduplicates it; its attempts, status and error start anew and it is retried with backoff as any delivery. Waits for the outcome as abx webhook test does (exit 1 unless delivered). Refused while the delivery is still pending, for a disabled webhook, or when its event is past the events' retention.",
      )
      .option('--no-wait', 'print that it is queued and return at once')
      .option(
        '--timeout <duration>',
        'wait at most this long for the outcome (default 30s; it is retried after that all the same)',
        durationArg,
      )
      .option('--json', 'print the delivery as JSON')
      .action(
        async (
          id: string,
          deliveryId: string,
          options: { wait: boolean; timeout?: number; json?: boolean },
        ) => {
          const queued = await Webhook.redeliver(id, deliveryId);
          await reportDelivery(id, queued, options, 'redelivery');
        },
      ),
    'abx webhook redeliver whk_0123456789abcdef0123 whd_0123456789abcdef01234567',
  );
}
