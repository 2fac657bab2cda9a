import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { SecretNotFoundError } from '../errors.js';
import { Secret, type SecretInfo } from '../sandbox/secret.js';
import { UsageError } from './errors.js';
import { collectPairs, withExamples } from './options.js';
import { ago, printFields, printJson, printLine, printTable } from './output.js';

interface ValueOptions {
  valueStdin?: boolean;
  valueFile?: string;
}

/** Reads all of stdin (a pipe or a file redirected in). */
async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/**
 * The value, from stdin or a file: never from the command line, where it would land in the
 * shell's history and in /proc/PID/cmdline for every user of the host to read. One trailing
 * newline (what `echo` and editors add) is not part of it.
 */
async function readValue(options: ValueOptions, command: string): Promise<string> {
  if (options.valueStdin && options.valueFile !== undefined) {
    throw new UsageError('give the value one way: --value-stdin or --value-file, not both');
  }
  let text: string;
  if (options.valueFile !== undefined) {
    try {
      text = readFileSync(options.valueFile, 'utf8');
    } catch (error) {
      throw new UsageError(
        `cannot read ${options.valueFile}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
      );
    }
  } else if (options.valueStdin) {
    text = await readStdin();
  } else {
    throw new UsageError(
      `give the value on stdin (--value-stdin, e.g. from a password manager: pass show openai | abx secret ${command} openai --value-stdin) or in a file (--value-file F)${command === 'update' ? ', or only new metadata (--meta KEY=VALUE)' : ''}; it is never taken from the command line, where shell history and ps would show it`,
      `abx secret ${command} --help`,
    );
  }
  return text.replace(/\r?\n$/, '');
}

function addValueOptions(command: Command): Command {
  return command
    .option('--value-stdin', 'read the value from stdin (one trailing newline is dropped)')
    .option('--value-file <file>', 'read the value from a file (one trailing newline is dropped)');
}

function printSecret(made: string, info: SecretInfo): void {
  printLine(`${made} secret ${info.name} (version ${info.version})`);
}

/** `abx secret create|update|list|info|rm`. */
export function addSecretCommand(program: Command): void {
  const secret = withExamples(
    program
      .command('secret')
      .description(
        "Manage secrets: values sandboxes' requests will carry without anyone reading them back. Values are write-only: given on stdin or in a file, never shown again. Each API key has its own.",
      ),
    'pass show openai | abx secret create openai --value-stdin',
    'abx secret create github --value-file ~/.config/gh-token --meta team=infra',
    'abx secret list',
  );

  withExamples(
    addValueOptions(
      secret
        .command('create <name>')
        .description(
          'Make a secret at version 1. Name: 1 to 64 letters, digits, _, - and . (kept lower-case); value: 1 byte to 64 KiB, from stdin or a file.',
        ),
    )
      .option('--meta <KEY=VALUE>', 'metadata to keep with it (repeatable)', collectPairs)
      .option('--json', 'print it as JSON (never the value)')
      .action(
        async (
          name: string,
          options: ValueOptions & { meta?: Record<string, string>; json?: boolean },
        ) => {
          const value = await readValue(options, 'create');
          const made = await Secret.create(name, value, {
            ...(options.meta ? { metadata: options.meta } : {}),
          });
          if (options.json) return printJson(made);
          printSecret('made', made);
        },
      ),
    'pass show openai | abx secret create openai --value-stdin',
    'abx secret create github --value-file token.txt --meta team=infra',
  );

  withExamples(
    addValueOptions(
      secret
        .command('update <name>')
        .description(
          'Give a secret a new value (its next version, used from the next request on) and/or new metadata (--meta replaces all of it). With --meta and no value option, only the metadata changes.',
        ),
    )
      .option(
        '--meta <KEY=VALUE>',
        'its new metadata, replacing the old (repeatable)',
        collectPairs,
      )
      .option('--json', 'print it as JSON (never the value)')
      .action(
        async (
          name: string,
          options: ValueOptions & { meta?: Record<string, string>; json?: boolean },
        ) => {
          const metadataOnly =
            options.meta !== undefined && !options.valueStdin && options.valueFile === undefined;
          const updated = metadataOnly
            ? await Secret.setMetadata(name, options.meta as Record<string, string>)
            : await Secret.update(name, await readValue(options, 'update'), {
                ...(options.meta ? { metadata: options.meta } : {}),
              });
          if (options.json) return printJson(updated);
          printSecret('updated', updated);
        },
      ),
    'pass show openai | abx secret update openai --value-stdin',
    'abx secret update openai --meta team=ops',
  );

  withExamples(
    secret
      .command('list')
      .alias('ls')
      .description(
        "List your secrets (an admin key: every key's, with the owner): names, versions, metadata, never values.",
      )
      .option('--json', 'print them as JSON')
      .action(async (options: { json?: boolean }) => {
        const secrets = await Secret.list();
        if (options.json) return printJson(secrets);
        if (secrets.length === 0) {
          process.stderr.write('no secrets: make one with abx secret create NAME --value-stdin\n');
          return;
        }
        const owners = secrets.some((s) => s.owner !== undefined);
        printTable(
          ['NAME', 'VERSION', 'UPDATED', 'METADATA', ...(owners ? ['OWNER'] : []), 'ID'],
          secrets.map((s) => [
            s.name,
            String(s.version),
            ago(s.updatedAt),
            Object.entries(s.metadata)
              .map(([k, v]) => `${k}=${v}`)
              .join(',') || '-',
            ...(owners ? [s.owner ?? '(daemon key)'] : []),
            s.secretId,
          ]),
        );
      }),
    'abx secret list --json',
  );

  withExamples(
    secret
      .command('info <name>')
      .description("Show a secret's version, metadata and times (never its value).")
      .option('--json', 'print it as JSON')
      .action(async (name: string, options: { json?: boolean }) => {
        const info = await Secret.getInfo(name);
        if (options.json) return printJson(info);
        printFields([
          ['name', info.name],
          ['id', info.secretId],
          ['version', String(info.version)],
          [
            'metadata',
            Object.entries(info.metadata)
              .map(([k, v]) => `${k}=${v}`)
              .join(', ') || '-',
          ],
          ['created', `${info.createdAt} (${ago(info.createdAt)})`],
          ['updated', `${info.updatedAt} (${ago(info.updatedAt)})`],
          ...(info.owner === undefined
            ? []
            : [['owner', info.owner ?? '(daemon key)'] as [string, string]]),
        ]);
      }),
    'abx secret info openai',
  );

  withExamples(
    secret
      .command('rm <names...>')
      .alias('remove')
      .description('Remove secrets and every version of their values.')
      .action(async (names: string[]) => {
        for (const name of names) {
          if (!(await Secret.destroy(name))) {
            throw new SecretNotFoundError(`no secret named ${name} (abx secret list lists yours)`);
          }
          printLine(`removed secret ${name}`);
        }
      }),
    'abx secret rm openai',
  );
}
