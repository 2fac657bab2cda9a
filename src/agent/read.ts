import { MAX_BINARY_BYTES, type ToolError } from '../../runtime/server/file-tools/protocol.js';
import { isToolError, type ToolRunner } from './tool-runner.js';
import type { ReadOptions, ReadResult } from './types.js';

/** Default `limit` of {@link BaseSandbox.read}. */
export const DEFAULT_READ_LIMIT = 2000;

/** Extensions read as base64 whatever their bytes: media a multimodal model can take whole. */
const MEDIA_EXTENSIONS = new Set(
  (
    'png jpeg jpg webp gif heic heif bmp tiff ico ' + // images
    'mp4 mpeg mov avi flv mpg webm wmv 3gpp mkv ' + // video
    'wav mp3 aiff aac ogg flac m4a opus ' + // audio
    'pdf ppt pptx'
  ).split(' '),
);

function isMedia(path: string): boolean {
  const name = path.slice(path.lastIndexOf('/') + 1);
  const dot = name.lastIndexOf('.');
  return dot > 0 && MEDIA_EXTENSIONS.has(name.slice(dot + 1).toLowerCase());
}

/** Negative, fractional or non-numeric bounds become whole numbers ≥ 0. */
function bound(value: number | undefined, fallback: number): number {
  const n = value === undefined ? fallback : Number(value);
  if (Number.isNaN(n)) return 0;
  return Math.min(Math.max(0, Math.floor(n)), Number.MAX_SAFE_INTEGER);
}

function readError(path: string, offset: number, answer: ToolError): string {
  switch (answer.error) {
    case 'file_not_found':
      return `File '${path}' not found`;
    case 'is_directory':
      return `'${path}' is a directory, not a file (list it with ls)`;
    case 'not_a_file':
      return `'${path}' is not a regular file`;
    case 'permission_denied':
      return `Permission denied reading '${path}'`;
    case 'binary_too_large':
      return `File '${path}' is binary (${answer.size} bytes) and exceeds the maximum preview size of ${MAX_BINARY_BYTES} bytes`;
    case 'offset_exceeds':
      return `Line offset ${offset} exceeds file length (${answer.lines} lines)`;
    default:
      return `Error reading '${path}': ${answer.detail ?? answer.error}`;
  }
}

/** {@link BaseSandbox.read}: pages the file on the sandbox side. */
export async function readFile(
  runner: ToolRunner,
  path: string,
  options: ReadOptions = {},
): Promise<ReadResult> {
  const offset = bound(options.offset, 0);
  const limit = bound(options.limit, DEFAULT_READ_LIMIT);
  const outcome = await runner.run('read', { path, offset, limit, media: isMedia(path) });
  if (!outcome.ok) return { error: outcome.error };
  const page = outcome.value;
  if (isToolError(page)) return { error: readError(path, offset, page) };
  const result: ReadResult = { fileData: { content: page.content, encoding: page.encoding } };
  if (page.noLinesRequested) result.noLinesRequested = true;
  if (page.startLine !== undefined) {
    if (page.totalLines !== undefined) result.totalLines = page.totalLines;
    result.startLine = page.startLine;
    result.endLine = page.endLine;
    result.nextOffset = page.nextOffset ?? null;
  }
  return result;
}
