// The main job: create a sandbox, start the command server with the DataTools class, call a
// registered command and a YAML command, print the results, kill the sandbox.
import 'reflect-metadata';
import { fileURLToPath } from 'node:url';
import { Sandbox, Templates } from 'agent-sandbox';
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

const started = performance.now();
const elapsed = () => `${Math.round(performance.now() - started)} ms`;

// The template gives the sandbox the ports capability (for the server) and YAML commands.
const template = await Templates.build(fileURLToPath(new URL('../template.yaml', import.meta.url)));
console.log(`template '${template.name}' built (${elapsed()})`);

const sandbox = await Sandbox.create({ template: template.name, timeoutMs: 120_000 });
console.log(`sandbox ${sandbox.sandboxId} created (${elapsed()})`);
try {
  await sandbox.files.write('people.csv', CSV);

  await sandbox.server.start({ commands: [DataTools] });
  console.log(`command server running at ${sandbox.server.url} (${elapsed()})`);

  const summary = await sandbox.server.call<Summary>('summarize', {
    path: 'people.csv',
    top: 2,
    column: 'city',
  });
  console.log(`summarize → ${JSON.stringify(summary)}`);

  const calls = 100;
  const t0 = performance.now();
  for (let i = 0; i < calls; i++) await sandbox.server.call('add', { x: i, y: 1 });
  console.log(`add × ${calls}: ${((performance.now() - t0) / calls).toFixed(2)} ms per call`);

  const head = (await sandbox.run('head', { path: 'people.csv', lines: 3 })) as { stdout: string };
  console.log(`head (YAML command) →\n${head.stdout.trimEnd()}`);
} finally {
  await sandbox.kill();
  console.log(`sandbox killed (${elapsed()})`);
}
