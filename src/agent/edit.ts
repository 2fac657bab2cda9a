import type { ToolError } from '../../runtime/server/file-tools/protocol.js';
import { isToolError, type ToolRunner } from './tool-runner.js';
import type { EditOptions, EditResult } from './types.js';

function editError(path: string, oldString: string, answer: ToolError): string {
  switch (answer.error) {
    case 'file_not_found':
      return `Error: File '${path}' not found`;
    case 'is_directory':
      return `Error: '${path}' is a directory, not a file`;
    case 'not_a_file':
      return `Error: '${path}' is not a regular file`;
    case 'not_text':
      return `Error: File '${path}' is not a text file (not valid UTF-8); it cannot be edited as text`;
    case 'permission_denied':
      return `Error: Permission denied editing '${path}'`;
    case 'not_found':
      return `Error: String not found in file '${path}': '${oldString}'`;
    case 'multiple':
      return `Error: String '${oldString}' appears ${answer.count} times in '${path}'. Use replaceAll: true to replace every occurrence, or give more surrounding context to make it unique.`;
    default:
      return `Error editing '${path}': ${answer.detail ?? answer.error}`;
  }
}

/** {@link BaseSandbox.edit}: the strings travel as base64 of their UTF-8 bytes. */
export async function editFile(
  runner: ToolRunner,
  path: string,
  oldString: string,
  newString: string,
  options: EditOptions = {},
): Promise<EditResult> {
  if (oldString === '') return { error: 'Error: oldString must not be empty' };
  const outcome = await runner.run('edit', {
    path,
    replaceAll: options.replaceAll ?? false,
    old: Buffer.from(oldString, 'utf8').toString('base64'),
    new: Buffer.from(newString, 'utf8').toString('base64'),
  });
  if (!outcome.ok) return { error: `Error editing '${path}': ${outcome.error}` };
  const answer = outcome.value;
  if (isToolError(answer)) {
    return {
      error: editError(path, oldString, answer),
      errorCode: answer.error,
      ...(answer.error === 'multiple' ? { occurrences: answer.count as number } : {}),
    };
  }
  return { path, occurrences: answer.count };
}
