// The main job: build the data-tools template, create a sandbox, start the command server with
// the DataTools class, call a registered command and the YAML command, list the commands, kill
// the sandbox. One line per step, with the time it took.
import { fileURLToPath } from 'node:url';
import { Sandbox, Templates } from 'abx-sandbox';
import { DataTools, type Summary } from './data-tools.js';

const CSV = `name,city
ada,london
grace,new york
linus,helsinki
alan,london
margaret,boston
ken,new york
barbara,london
`;

/** Runs one step and prints what it did and how long it took. */
async function step<T>(what: string, run: () => Promise<T>, show?: (value: T) => string) {
  const started = performance.now();
  const value = await run();
  const ms = (performance.now() - started).toFixed(1).padStart(7);
  console.log(`[${ms} ms] ${what}${show ? `: ${show(value)}` : ''}`);
  return value;
}

const template = await step(
  'build template',
  () => Templates.build(fileURLToPath(new URL('../template.yaml', import.meta.url))),
  (t) => `${t.name} (capabilities: ${t.capabilities.join(', ')})`,
);
const sandbox = await step(
  'create sandbox',
  () => Sandbox.create({ template: template.name, timeoutMs: 120_000 }),
  (s) => s.sandboxId,
);
try {
  await step('write people.csv', () => sandbox.files.write('people.csv', CSV));
  await step(
    'start command server',
    () => sandbox.server.start({ commands: [DataTools] }),
    (server) => server.url,
  );
  await step(
    'call summarize (decorated)',
    () => sandbox.server.call<Summary>('summarize', { path: 'people.csv', top: 2, column: 'city' }),
    (summary) => JSON.stringify(summary),
  );
  await step(
    'call add × 100',
    async () => {
      for (let i = 0; i < 99; i++) await sandbox.server.call('add', { x: i, y: 1 });
      return sandbox.server.call<number>('add', { x: 99, y: 1 });
    },
    (last) => `last result ${last}`,
  );
  await step(
    'run head (YAML)',
    () => sandbox.run('head', { path: 'people.csv', lines: 3 }) as Promise<{ stdout: string }>,
    (result) => JSON.stringify(result.stdout),
  );
  const commands = await step('list commands', () => sandbox.listCommands());
  for (const command of commands) {
    const args = command.args
      .map((a) =>
        a.required ? `${a.name}: ${a.type}` : `${a.name}: ${a.type} = ${JSON.stringify(a.default)}`,
      )
      .join(', ');
    console.log(`             ${command.source.padEnd(9)} ${command.name}(${args})`);
  }
} finally {
  await step('kill sandbox', () => sandbox.kill());
}
