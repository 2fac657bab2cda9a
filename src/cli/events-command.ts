import { type Command, InvalidArgumentError } from 'commander';
import { lifecycleText } from '../sandbox/activity-text.js';
import type {
  SandboxEventsOptions,
  SandboxEventType,
  SandboxLifecycleEvent,
} from '../sandbox/sandbox-events.js';
import { time } from './audit-command.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';
import { paint } from './style.js';

const TYPES: readonly string[] = [
  'created',
  'updated',
  'paused',
  'resumed',
  'killed',
  'checkpointed',
  'failed',
  'expiring',
];

/** `--type killed,paused` (or the full names): the event types asked for. */
function typeList(text: string, previous: SandboxEventType[] = []): SandboxEventType[] {
  const types = text.split(',').map((type) => type.trim().replace(/^sandbox\.lifecycle\./, ''));
  for (const type of types) {
    if (!TYPES.includes(type)) {
      throw new InvalidArgumentError(`'${type}' is not an event type: use ${TYPES.join(', ')}`);
    }
  }
  return [...previous, ...types.map((type) => `sandbox.lifecycle.${type}` as SandboxEventType)];
}

/** What an event says, in a few words (the dashboard's Events tab says the same). */
function summary(event: SandboxLifecycleEvent): string {
  const end = (at: unknown) => (typeof at === 'number' ? new Date(at).toISOString() : '');
  const text = lifecycleText(event.type, event.data, end);
  return event.type === 'sandbox.lifecycle.created' ? `${event.template} ${text}` : text;
}

const COLOURS: Record<string, 'green' | 'red' | 'yellow' | 'cyan' | 'dim'> = {
  created: 'green',
  resumed: 'green',
  killed: 'red',
  failed: 'red',
  paused: 'yellow',
  expiring: 'yellow',
};

function eventText(event: SandboxLifecycleEvent): string {
  const type = event.type.replace('sandbox.lifecycle.', '');
  return `${event.at} ${event.sandboxId} ${paint(COLOURS[type] ?? 'cyan', type.padEnd(12))} ${summary(event)}`;
}

async function events(options: {
  sandbox?: string;
  type?: SandboxEventType[];
  since?: number;
  until?: number;
  follow?: boolean;
  json?: boolean;
  jsonl?: boolean;
}): Promise<void> {
  if (options.follow && options.json) {
    throw new InvalidArgumentError(
      '--json prints one array at the end, which a follow never reaches: use --jsonl with --follow',
    );
  }
  // Loaded here: `abx events` alone needs the SDK.
  const { openControl } = await import('../sandbox/sandbox-api.js');
  const { readSandboxEvents, followSandboxEvents } = await import('../sandbox/sandbox-events.js');
  const { client, connection } = await openControl();
  const query: SandboxEventsOptions = {
    limit: 1000,
    ...(options.sandbox ? { sandboxId: options.sandbox } : {}),
    ...(options.type ? { type: options.type } : {}),
    ...(options.since === undefined ? {} : { since: options.since }),
    ...(options.until === undefined ? {} : { until: options.until }),
  };
  const all: SandboxLifecycleEvent[] = [];
  const print = (event: SandboxLifecycleEvent) => {
    if (options.jsonl) printLine(JSON.stringify(event));
    else if (!options.json) printLine(eventText(event));
    else all.push(event);
  };
  let cursor: number | undefined;
  for (;;) {
    const page = await readSandboxEvents(client, {
      ...query,
      ...(cursor === undefined ? {} : { cursor }),
    });
    for (const event of page.events) print(event);
    cursor = page.cursor ?? cursor;
    if (!page.more) break;
  }
  if (options.follow) {
    // From the last event printed (or the newest there is): none missed between.
    for await (const event of followSandboxEvents(connection, {
      ...(options.sandbox ? { sandboxId: options.sandbox } : {}),
      ...(options.type ? { type: options.type } : {}),
      ...(cursor === undefined ? {} : { after: cursor }),
    })) {
      print(event);
    }
  }
  if (options.json) printJson(all);
}

/** `abx events`: the lifecycle events of the key's sandboxes. */
export function addEventsCommand(program: Command): void {
  withExamples(
    program
      .command('events')
      .description(
        "Show the lifecycle events of the key's sandboxes (an admin key: every sandbox's), oldest first: created, updated (timeout, network), paused, resumed, checkpointed (snapshot), killed (with why: api, expired, oom, dead, revoked, failed), failed to start, and expiring (its timeout is near). Each is recorded with the change it is about; kept ABX_EVENTS_RETENTION_MS (7 days). docs/events.md.",
      )
      .option('--sandbox <id>', "only this sandbox's events")
      .option(
        '--type <types>',
        `only these types (comma-separated, repeatable: ${TYPES.join(', ')})`,
        typeList,
      )
      .option(
        '--since <time>',
        'only events at or after this (ISO 8601, ms, or an age: 10m, 2h)',
        time,
      )
      .option('--until <time>', 'only events before this', time)
      .option('--json', 'print the events as one JSON array')
      .option('--jsonl', 'print each event as a JSON line')
      .option(
        '-f, --follow',
        'then print each new event as it is recorded, until Ctrl-C (a dropped connection resumes where it was)',
      )
      .action(events),
    'abx events',
    'abx events --sandbox i1a2b3c4d5e6f7g8',
    'abx events --type killed,expiring --since 1h',
    'abx events --follow --jsonl',
  );
}
