import { parseArgs } from 'node:util';
import { SandboxServer } from './server.js';

const USAGE = `usage: node server.cjs [--host H] [--port P] [--socket PATH] [--token T] [--load FILE.cjs]... [--groups a,b]
  [--body-limit BYTES] [--body-timeout-ms MS] [--command-timeout-ms MS] [--grace-ms MS]
The token can also come from ABX_SERVER_TOKEN. Port 0 picks a free port.`;

function positiveInt(name: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(value)) {
    throw new Error(`--${name} must be a whole number, not ${JSON.stringify(text)}`);
  }
  return value;
}

/** Exits with the status; 2 for a bad command line, 1 for a server that cannot start. */
function fail(message: string, status: number): never {
  process.stderr.write(`abx-server: ${message}\n`);
  process.exit(status);
}

async function main(): Promise<void> {
  let server: SandboxServer;
  try {
    const { values } = parseArgs({
      options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '0' },
        token: { type: 'string' },
        load: { type: 'string', multiple: true, default: [] },
        groups: { type: 'string' },
        socket: { type: 'string' },
        'body-limit': { type: 'string' },
        'body-timeout-ms': { type: 'string' },
        'command-timeout-ms': { type: 'string' },
        'grace-ms': { type: 'string' },
        help: { type: 'boolean', default: false },
      },
      strict: true,
    });
    if (values.help) {
      process.stdout.write(`${USAGE}\n`);
      return;
    }
    const port = positiveInt('port', values.port) ?? 0;
    if (port > 65535) throw new Error(`--port must be at most 65535, not ${port}`);
    server = new SandboxServer({
      host: values.host,
      port,
      token: values.token ?? (process.env.ABX_SERVER_TOKEN || undefined),
      groups: values.groups,
      extraSocketPath: values.socket,
      bodyLimitBytes: positiveInt('body-limit', values['body-limit']),
      bodyTimeoutMs: positiveInt('body-timeout-ms', values['body-timeout-ms']),
      commandTimeoutMs: positiveInt('command-timeout-ms', values['command-timeout-ms']),
      graceMs: positiveInt('grace-ms', values['grace-ms']),
    });
    for (const file of values.load ?? []) server.load(file);
  } catch (error) {
    fail(`${(error as Error).message}\n${USAGE}`, 2);
  }
  let address: { host: string; port: number };
  try {
    address = await server.start();
  } catch (error) {
    fail(`cannot listen: ${(error as Error).message}`, 1);
  }
  for (const signal of ['SIGTERM', 'SIGINT'] as const) {
    process.once(signal, () => void server.stop());
  }
  process.stdout.write(`${JSON.stringify({ event: 'listening', ...address, pid: process.pid })}\n`);
  await server.stopped;
  process.exit(0);
}

void main();
