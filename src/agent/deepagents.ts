import type { BaseSandbox } from './base-sandbox.js';
import type {
  ExecuteResponse,
  FileDownloadResponse,
  FileInfo,
  FileUploadResponse,
} from './types.js';

/**
 * Use an abx sandbox as the sandbox backend of LangChain deepagents (JS):
 *
 * ```ts
 * import { createDeepAgent } from 'deepagents';
 * import { Sandbox, deepAgentsBackend } from 'agent-sandbox';
 *
 * const sandbox = await Sandbox.create({ template: 'base' });
 * const agent = createDeepAgent({ model, backend: deepAgentsBackend(sandbox) });
 * ```
 *
 * The adapter is a plain object implementing deepagents' `SandboxBackendProtocolV2` (checked
 * structurally: nothing here imports deepagents, so it stays an optional peer). Its file
 * operations are this project's {@link BaseSandbox} ones — they run as node helpers inside the
 * sandbox, not as the awk/find pipelines of deepagents' own `BaseSandbox` — translated to
 * deepagents' shapes: snake_case `FileInfo`, `files` instead of `entries`/`matches`, directories
 * listed with a trailing `/`, positional arguments, `mimeType` on reads.
 *
 * It works for any {@link BaseSandbox}, e.g. a `LocalShellSandbox` too.
 */
export function deepAgentsBackend(sandbox: BaseSandbox): DeepAgentsBackend {
  return {
    get id() {
      return sandbox.id;
    },
    execute: (command) => sandbox.execute(command),
    uploadFiles: (files) => sandbox.uploadFiles(files),
    downloadFiles: (paths) => sandbox.downloadFiles(paths),
    async ls(path) {
      const result = await sandbox.ls(path);
      if (result.error !== undefined) return { error: result.error };
      return {
        files: (result.entries ?? []).map((entry) => ({
          ...fileInfo(entry),
          // deepagents marks directories in listings with a trailing slash.
          path: entry.isDir ? `${entry.path}/` : entry.path,
        })),
      };
    },
    async read(filePath, offset = 0, limit = 500) {
      const page = await sandbox.read(filePath, { offset, limit });
      if (page.error !== undefined || !page.fileData) {
        return { error: page.error ?? `Error: reading '${filePath}' gave no content` };
      }
      if (page.fileData.encoding === 'base64') {
        return {
          content: new Uint8Array(Buffer.from(page.fileData.content, 'base64')),
          mimeType: binaryMimeType(filePath),
        };
      }
      return {
        content: page.fileData.content,
        mimeType: 'text/plain',
        ...(page.totalLines === undefined ? {} : { totalLines: page.totalLines }),
        ...(page.startLine === undefined ? {} : { startLine: page.startLine }),
        ...(page.endLine === undefined ? {} : { endLine: page.endLine }),
        // deepagents leaves nextOffset out at the end of the file; ours says null.
        ...(page.nextOffset == null ? {} : { nextOffset: page.nextOffset }),
      };
    },
    async readRaw(filePath) {
      const [response] = await sandbox.downloadFiles([filePath]);
      if (!response?.content) {
        return { error: `Error: cannot read '${filePath}': ${response?.error ?? 'no response'}` };
      }
      const now = new Date().toISOString();
      const text = decodeUtf8(response.content);
      return {
        data: {
          content: text ?? response.content,
          mimeType: text === undefined ? binaryMimeType(filePath) : 'text/plain',
          created_at: now,
          modified_at: now,
        },
      };
    },
    async write(filePath, content) {
      const result = await sandbox.write(filePath, content);
      return result.error !== undefined
        ? { error: result.error }
        : { path: filePath, filesUpdate: null };
    },
    async edit(filePath, oldString, newString, replaceAll = false) {
      const result = await sandbox.edit(filePath, oldString, newString, { replaceAll });
      if (result.error !== undefined) return { error: result.error };
      return {
        path: filePath,
        filesUpdate: null,
        ...(result.occurrences === undefined ? {} : { occurrences: result.occurrences }),
      };
    },
    async delete(filePath) {
      const result = await sandbox.delete(filePath);
      return result.error !== undefined
        ? { error: result.error }
        : { path: filePath, filesUpdate: null };
    },
    async grep(pattern, path, glob, maxCount) {
      const result = await sandbox.grep(pattern, {
        ...(path ? { path } : {}),
        ...(glob ? { glob } : {}),
        ...(maxCount ? { maxCount } : {}),
      });
      if (result.error !== undefined) return { error: result.error };
      return { matches: result.matches ?? [], truncated: result.truncated };
    },
    async glob(pattern, path = '/') {
      const result = await sandbox.glob(pattern, { path });
      if (result.error !== undefined) return { error: result.error };
      return { files: (result.matches ?? []).map(fileInfo), truncated: result.truncated };
    },
  };
}

function fileInfo(entry: FileInfo): DeepAgentsFileInfo {
  return {
    path: entry.path,
    is_dir: entry.isDir,
    ...(entry.size === undefined ? {} : { size: entry.size }),
    ...(entry.modifiedAt === undefined ? {} : { modified_at: entry.modifiedAt }),
  };
}

function decodeUtf8(bytes: Uint8Array): string | undefined {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

/** deepagents picks how to show binary content (image block, file block...) by MIME type. */
const MIME_TYPES: Record<string, string> = {
  png: 'image/png',
  jpg: 'image/jpeg',
  jpeg: 'image/jpeg',
  gif: 'image/gif',
  webp: 'image/webp',
  bmp: 'image/bmp',
  pdf: 'application/pdf',
  mp3: 'audio/mpeg',
  wav: 'audio/wav',
  ogg: 'audio/ogg',
  mp4: 'video/mp4',
  webm: 'video/webm',
};

function binaryMimeType(path: string): string {
  const dot = path.lastIndexOf('.');
  const ext = dot > path.lastIndexOf('/') ? path.slice(dot + 1).toLowerCase() : '';
  return MIME_TYPES[ext] ?? 'application/octet-stream';
}

/** deepagents' `FileInfo` (snake_case). */
export interface DeepAgentsFileInfo {
  path: string;
  is_dir?: boolean;
  size?: number;
  modified_at?: string;
}

type Failure = { error: string };

/**
 * The subset of deepagents' `SandboxBackendProtocolV2` that {@link deepAgentsBackend} implements:
 * all of it. Declared here so this package needs no deepagents types.
 */
export interface DeepAgentsBackend {
  readonly id: string;
  execute(command: string): Promise<ExecuteResponse>;
  uploadFiles(files: [string, Uint8Array][]): Promise<FileUploadResponse[]>;
  downloadFiles(paths: string[]): Promise<FileDownloadResponse[]>;
  ls(path: string): Promise<{ files: DeepAgentsFileInfo[] } | Failure>;
  read(
    filePath: string,
    offset?: number,
    limit?: number,
  ): Promise<
    | {
        content: string | Uint8Array;
        mimeType: string;
        totalLines?: number;
        startLine?: number;
        endLine?: number;
        nextOffset?: number;
      }
    | Failure
  >;
  readRaw(filePath: string): Promise<
    | {
        data: {
          content: string | Uint8Array;
          mimeType: string;
          created_at: string;
          modified_at: string;
        };
      }
    | Failure
  >;
  write(filePath: string, content: string): Promise<{ path: string; filesUpdate: null } | Failure>;
  edit(
    filePath: string,
    oldString: string,
    newString: string,
    replaceAll?: boolean,
  ): Promise<{ path: string; filesUpdate: null; occurrences?: number } | Failure>;
  delete(filePath: string): Promise<{ path: string; filesUpdate: null } | Failure>;
  grep(
    pattern: string,
    path?: string | null,
    glob?: string | null,
    maxCount?: number | null,
  ): Promise<
    { matches: { path: string; line: number; text: string }[]; truncated: boolean } | Failure
  >;
  glob(
    pattern: string,
    path?: string,
  ): Promise<{ files: DeepAgentsFileInfo[]; truncated: boolean } | Failure>;
}
