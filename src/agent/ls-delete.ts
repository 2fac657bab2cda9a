import { isToolError, type ToolRunner } from './tool-runner.js';
import type { DeleteResult, LsResult } from './types.js';

/** {@link BaseSandbox.ls}: one level, hidden entries included, symlinks not followed. */
export async function listDirectory(runner: ToolRunner, path: string): Promise<LsResult> {
  const outcome = await runner.run('ls', { path });
  if (!outcome.ok) return { error: outcome.error };
  const answer = outcome.value;
  if (!isToolError(answer)) return { entries: answer.entries };
  return { error: lsError(path, answer.error, answer.detail), errorCode: answer.error };
}

function lsError(path: string, code: string, detail: string | undefined): string {
  switch (code) {
    case 'file_not_found':
      return `Path '${path}' not found`;
    case 'not_a_directory':
      return `Path '${path}' is not a directory`;
    case 'permission_denied':
      return `Permission denied listing '${path}'`;
    default:
      return `Error listing '${path}': ${detail ?? code}`;
  }
}

/** {@link BaseSandbox.delete}. */
export async function deletePath(runner: ToolRunner, path: string): Promise<DeleteResult> {
  if (path === '') return { error: 'Error: path is empty' };
  const outcome = await runner.run('delete', { path });
  if (!outcome.ok) return { error: outcome.error };
  const answer = outcome.value;
  if (!isToolError(answer)) return { path };
  switch (answer.error) {
    case 'not_found':
      return { error: `Error: '${path}' not found` };
    case 'permission_denied':
      return { error: `Error: Permission denied deleting '${path}'` };
    default:
      return { error: `Error deleting '${path}': ${answer.detail ?? answer.error}` };
  }
}
