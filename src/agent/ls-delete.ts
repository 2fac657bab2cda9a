import type { BaseSandbox } from './base-sandbox.js';
import { isHelperError, runHelper } from './helper.js';
import type { DeleteResult, LsResult } from './types.js';

/** {@link BaseSandbox.ls}: one level, hidden entries included, symlinks not followed. */
export async function listDirectory(sandbox: BaseSandbox, path: string): Promise<LsResult> {
  const outcome = await runHelper(sandbox, 'ls', { path });
  if (!outcome.ok) return { error: outcome.error };
  const answer = outcome.value;
  if (!isHelperError(answer)) return { entries: answer.entries };
  switch (answer.error) {
    case 'file_not_found':
      return { error: `Path '${path}' not found` };
    case 'not_a_directory':
      return { error: `Path '${path}' is not a directory` };
    case 'permission_denied':
      return { error: `Permission denied listing '${path}'` };
    default:
      return { error: `Error listing '${path}': ${answer.detail ?? answer.error}` };
  }
}

/** {@link BaseSandbox.delete}. */
export async function deletePath(sandbox: BaseSandbox, path: string): Promise<DeleteResult> {
  if (path === '') return { error: 'Error: path is empty' };
  const outcome = await runHelper(sandbox, 'delete', { path });
  if (!outcome.ok) return { error: outcome.error };
  const answer = outcome.value;
  if (!isHelperError(answer)) return { path };
  switch (answer.error) {
    case 'not_found':
      return { error: `Error: '${path}' not found` };
    case 'permission_denied':
      return { error: `Error: Permission denied deleting '${path}'` };
    default:
      return { error: `Error deleting '${path}': ${answer.detail ?? answer.error}` };
  }
}
