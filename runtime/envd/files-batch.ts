import { stat } from 'node:fs/promises';
import { BadRequestError } from '../server/errors.js';
import { safePath, writeAtomic } from '../server/file-system.js';
import { describe } from '../server/groups/files.js';
import { defineGroup } from '../server/route-group.js';

/** Most files one batch may carry; more should go as several batches or a stream each. */
export const MAX_BATCH_FILES = 10_000;

interface BatchFile {
  path: string;
  content: Buffer;
}

function parseBatch(body: unknown): BatchFile[] {
  const unknown = Object.keys(body ?? {}).filter((key) => key !== 'files');
  if (typeof body === 'object' && body !== null && unknown.length > 0) {
    throw new BadRequestError(
      `unknown field${unknown.length > 1 ? 's' : ''} ${unknown.slice(0, 5).join(', ')}${unknown.length > 5 ? ` and ${unknown.length - 5} more` : ''}: the body is { "files": [...] }`,
    );
  }
  const files = (body as { files?: unknown } | undefined)?.files;
  if (!Array.isArray(files) || files.length === 0) {
    throw new BadRequestError(
      'the body must be { "files": [{ "path", "content", "encoding"? }, ...] } with at least one file',
    );
  }
  if (files.length > MAX_BATCH_FILES) {
    throw new BadRequestError(`at most ${MAX_BATCH_FILES} files per batch, not ${files.length}`);
  }
  const seen = new Set<string>();
  return files.map((file: unknown, index) => {
    const { path, content, encoding = 'utf-8' } = (file ?? {}) as Record<string, unknown>;
    const where = `files[${index}]`;
    if (typeof path !== 'string') throw new BadRequestError(`${where}.path must be a string`);
    if (typeof content !== 'string') throw new BadRequestError(`${where}.content must be a string`);
    if (encoding !== 'utf-8' && encoding !== 'base64') {
      throw new BadRequestError(`${where}.encoding must be utf-8 or base64`);
    }
    const resolved = safePath(path, `${where}.path`);
    if (seen.has(resolved)) throw new BadRequestError(`${where}.path ${resolved} is given twice`);
    seen.add(resolved);
    return {
      path: resolved,
      content: Buffer.from(content, encoding === 'base64' ? 'base64' : 'utf8'),
    };
  });
}

/**
 * Several files in one call, for the many small files an agent writes at once. Every entry is
 * checked before anything is written, so a bad entry changes nothing; each file is then written
 * atomically (temp file + rename).
 */
export const FILES_BATCH = defineGroup('FILES_BATCH', '/files/batch', 'several files in one call', [
  {
    method: 'POST',
    path: '/files/batch',
    summary:
      'Writes several files in one call: `{ files: [{ path, content, encoding? }] }`, all checked first, each atomic.',
    handler: async ({ body }) => {
      const files = parseBatch(body);
      const written: ReturnType<typeof describe>[] = [];
      for (const file of files) {
        await writeAtomic(file.path, file.content);
        written.push(describe(file.path, await stat(file.path)));
      }
      return { files: written };
    },
  },
]);
