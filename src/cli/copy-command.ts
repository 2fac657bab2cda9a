import { stat } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import type { Command } from 'commander';
import { NotFoundError, SandboxNotFoundError } from '../errors.js';
import type { EntryInfo } from '../sandbox/filesystem.js';
import { Sandbox } from '../sandbox/sandbox.js';
import { UsageError } from './errors.js';
import { formatBytes } from './feedback.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';
import { downloadDirectory, downloadFile, uploadDirectory, uploadFile } from './transfer.js';

/** `ID:PATH` names a path in a sandbox, as scp does: a colon before any slash. */
const REMOTE = /^([A-Za-z0-9_-]+):(.*)$/;

interface Endpoint {
  sandboxId?: string;
  path: string;
}

function endpoint(text: string): Endpoint {
  const match = REMOTE.exec(text);
  return match ? { sandboxId: match[1], path: match[2] || '.' } : { path: text };
}

/** Joins a remote directory and a name with the sandbox's `/`, whatever the host's separator. */
function remoteJoin(dir: string, name: string): string {
  return `${dir.replace(/\/+$/, '')}/${name}`;
}

async function remoteStat(sandbox: Sandbox, path: string): Promise<EntryInfo | undefined> {
  try {
    return await sandbox.files.stat(path);
  } catch (error) {
    // The file (or process) is missing; a sandbox that is gone is an error.
    if (error instanceof NotFoundError && !(error instanceof SandboxNotFoundError))
      return undefined;
    throw error;
  }
}

async function localStat(path: string) {
  return stat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === 'ENOENT') return undefined;
    throw error;
  });
}

/**
 * Where a copy of `name` lands, `cp -r` style: inside `dest` when that is an existing directory
 * (or ends with `/`), else at `dest` itself.
 */
function landing(
  dest: string,
  destIsDir: boolean,
  name: string,
  joinPath: (a: string, b: string) => string,
) {
  return destIsDir || dest.endsWith('/') ? joinPath(dest, name) : dest;
}

interface CopyResult {
  from: string;
  to: string;
  type: 'file' | 'directory';
  bytes: number;
}

async function upload(local: string, remote: Required<Endpoint>): Promise<CopyResult> {
  const source = await localStat(local);
  if (!source) throw new NotFoundError(`${local}: no such file or directory`);
  const sandbox = await Sandbox.connect(remote.sandboxId);
  const dest = await remoteStat(sandbox, remote.path);
  const to = landing(remote.path, dest?.type === 'directory', basename(resolve(local)), remoteJoin);
  const type = source.isDirectory() ? 'directory' : 'file';
  const bytes =
    type === 'directory'
      ? await uploadDirectory(sandbox, local, to)
      : await uploadFile(sandbox, local, to);
  return { from: local, to: `${remote.sandboxId}:${to}`, type, bytes };
}

async function download(remote: Required<Endpoint>, local: string): Promise<CopyResult> {
  const sandbox = await Sandbox.connect(remote.sandboxId);
  const source = await sandbox.files.stat(remote.path);
  const dest = await localStat(local);
  const to = landing(local, dest?.isDirectory() ?? false, source.name, join);
  const type = source.type === 'directory' ? 'directory' : 'file';
  const bytes =
    type === 'directory'
      ? await downloadDirectory(sandbox, remote.path, to)
      : await downloadFile(sandbox, remote.path, source.size, to);
  return { from: `${remote.sandboxId}:${remote.path}`, to, type, bytes };
}

async function copy(sourceText: string, destText: string, options: { json?: boolean }) {
  const [source, dest] = [endpoint(sourceText), endpoint(destText)];
  let result: CopyResult;
  if (source.sandboxId && !dest.sandboxId) {
    result = await download(source as Required<Endpoint>, dest.path);
  } else if (!source.sandboxId && dest.sandboxId) {
    result = await upload(source.path, dest as Required<Endpoint>);
  } else {
    throw new UsageError(
      'exactly one side of cp must be in a sandbox, written ID:PATH',
      'abx cp --help',
    );
  }
  if (options.json) return printJson(result);
  printLine(
    `copied ${result.type} ${result.from} → ${result.to} (${formatBytes(result.bytes)} transferred)`,
  );
}

/** `abx cp`. */
export function addCopyCommand(program: Command): void {
  withExamples(
    program
      .command('cp')
      .description(
        'Copy a file or directory into a sandbox or out of it; one side is ID:PATH. A progress bar shows for large transfers on a terminal.',
      )
      .argument('<source>', 'a local path (./a:b for one with a colon) or ID:PATH')
      .argument('<destination>', 'a local path or ID:PATH; an existing directory receives the copy')
      .option('--json', 'print what was copied as JSON')
      .action(copy),
    'abx cp data.csv i1a2b3c4d5e6f7g8:/home/user/data.csv',
    'abx cp ./project i1a2b3c4d5e6f7g8:/home/user/',
    'abx cp i1a2b3c4d5e6f7g8:/home/user/out ./out',
  );
}
