import { existsSync } from 'node:fs';
import { InvalidArgumentError as ArgumentError, type Command } from 'commander';
import { InvalidArgumentError } from '../errors.js';
import { ApiKeys } from '../sandbox/api-keys.js';
import { openControl } from '../sandbox/sandbox-api.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface EnvOptions {
  keyName?: string;
  maxRunning?: number;
  domain?: boolean;
  json?: boolean;
}

/** A value for a POSIX shell, in single quotes. */
function quoted(value: string): string {
  return /^[A-Za-z0-9_./:@%+=-]+$/.test(value) ? value : `'${value.replace(/'/g, `'\\''`)}'`;
}

/** Parses `--max-running`: a whole number ≥ 1. */
function countArg(value: string): number {
  if (!/^\d+$/.test(value) || Number(value) < 1) {
    throw new ArgumentError('expected a whole number of sandboxes, 1 or more.');
  }
  return Number(value);
}

/**
 * The variables that point E2B's SDKs at this control plane: one URL (the gateway's, which serves
 * the API too), or, with `domain`, `E2B_DOMAIN` for a gateway that serves TLS by host names.
 */
async function e2bEnv(options: EnvOptions): Promise<void> {
  if (options.maxRunning !== undefined && options.keyName === undefined) {
    throw new InvalidArgumentError(
      '--max-running limits the key --key-name makes: give --key-name NAME too',
    );
  }
  const { connection, client } = await openControl();
  const local = connection.local;
  // Where sandboxes are reached: what this client is told to use, else what the daemon says.
  const gateway = options.domain
    ? (local?.remote?.publicGatewayUrl ??
      (local
        ? undefined
        : (await client.json<{ gatewayUrl?: string }>('GET', '/v1/health')).gatewayUrl))
    : (connection.gatewayUrl ??
      local?.gatewayUrl ??
      (await client.json<{ gatewayUrl?: string }>('GET', '/v1/health')).gatewayUrl);
  if (gateway === undefined) {
    throw new InvalidArgumentError(
      options.domain
        ? 'the daemon serves no TLS gateway for remote clients, so E2B_DOMAIN cannot work: start it with --listen HOST:PORT --tls-cert FILE --tls-key FILE --domain NAME, or leave out --domain for the one-URL lines'
        : `${connection.peer} did not say where its gateway is: set ABX_GATEWAY_URL to it`,
    );
  }
  const url = new URL(gateway);
  if (options.domain && url.protocol !== 'https:') {
    throw new InvalidArgumentError(
      `the gateway is ${url.origin}, plain HTTP: E2B's SDKs reach a domain over https only. Start the daemon with --tls-cert and --tls-key (or --public-url https://… behind a proxy that terminates TLS), or leave out --domain for the one-URL lines`,
    );
  }
  let apiKey = connection.apiKey;
  if (options.keyName !== undefined) {
    const created = await ApiKeys.create(options.keyName, {
      format: 'e2b',
      ...(options.maxRunning === undefined ? {} : { maxRunning: options.maxRunning }),
    });
    apiKey = created.key;
    process.stderr.write(
      `made API key '${created.name}' (${created.id}${created.maxRunning === null ? '' : `, at most ${created.maxRunning} running`}) for E2B_API_KEY: it is not shown again\n`,
    );
  }
  // A private CA that this client trusts by file: E2B's SDKs (Node) need it as NODE_EXTRA_CA_CERTS.
  const ca = process.env.ABX_CA_CERT;
  const caFile = ca !== undefined && !ca.includes('-----BEGIN') && existsSync(ca) ? ca : undefined;
  const env: Record<string, string> = options.domain
    ? { E2B_DOMAIN: url.host, E2B_API_KEY: apiKey }
    : {
        E2B_API_URL: url.origin,
        E2B_SANDBOX_URL: url.origin,
        // The SDK's Volume reaches a volume's files here, else at https://api.{domain}.
        E2B_VOLUME_API_URL: url.origin,
        E2B_API_KEY: apiKey,
      };
  if (caFile !== undefined) env.NODE_EXTRA_CA_CERTS = caFile;
  if (options.json) return printJson(env);
  // The URLs win over E2B_DOMAIN in the SDKs: a domain needs them gone.
  if (options.domain) printLine('unset E2B_API_URL E2B_SANDBOX_URL E2B_VOLUME_API_URL');
  for (const [name, value] of Object.entries(env)) printLine(`export ${name}=${quoted(value)}`);
  if (!options.domain && !/^e2b_[0-9a-f]+$/.test(apiKey)) {
    process.stderr.write(
      "E2B_API_KEY is not of E2B's form (e2b_ and hex): E2B's JS SDK takes it, its Python SDK checks the form; --key-name NAME makes one that both take\n",
    );
  }
}

/** `abx e2b env`: E2B's SDKs, unmodified, against this control plane (docs/e2b.md). */
export function addE2bCommand(program: Command): void {
  const e2b = program
    .command('e2b')
    .description(
      "E2B's SDKs (e2b, @e2b/code-interpreter) run unmodified against abx: see docs/e2b.md.",
    );
  withExamples(
    e2b
      .command('env')
      .description(
        "Print the export lines that point E2B's SDKs at this control plane: E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL all the gateway's URL (it serves the API too), or E2B_DOMAIN with --domain; and E2B_API_KEY, the key this client uses unless --key-name makes one.",
      )
      .option('--key-name <name>', "make an API key of this name, in E2B's form, for E2B_API_KEY")
      .option(
        '--max-running <n>',
        'with --key-name: the most sandboxes the key may run at once',
        countArg,
      )
      .option(
        '--domain',
        'print E2B_DOMAIN instead of the URLs: the SDKs then reach api.{domain} and {port}-{id}.{domain} over TLS (a daemon started with --listen, --tls-cert and --domain, and names that resolve to it)',
      )
      .option('--json', 'print the variables as a JSON object')
      .action(e2bEnv),
    'eval "$(abx e2b env)"',
    'eval "$(abx e2b env --key-name agents --max-running 10)"',
    'ABX_API_URL=https://abx.example.com:8443 ABX_API_KEY=... abx e2b env --domain',
  );
}
