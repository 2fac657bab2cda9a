import { resolve } from 'node:path';
import type { CustomCommand } from '../commands/custom-command.js';
import type { TemplateResources } from '../commands/template-runtime.js';
import { type ConnectionOptions, connectDaemon } from '../installation/daemon-connection.js';
import { daemonClient, type HttpClient } from './http-client.js';

/** A built template as the control plane describes it. */
export interface TemplateInfo {
  name: string;
  description: string;
  capabilities: string[];
  network: 'none' | 'host';
  timeoutMs: number;
  workdir: string;
  env: Record<string, string>;
  resources: TemplateResources;
  setup: string[];
  customCommands: CustomCommand[];
  builtAt: string | null;
  path: string | null;
}

/** Building runs setup steps; give it time. */
const BUILD_TIMEOUT_MS = 3_600_000;

async function client(options: ConnectionOptions, timeoutMs?: number): Promise<HttpClient> {
  const connection = await connectDaemon(options);
  return daemonClient(connection, timeoutMs ?? options.requestTimeoutMs ?? 60_000);
}

/** Templates of the local installation: build from a `template.yaml`, list, remove. */
export const Templates = {
  /**
   * Builds (or rebuilds) the template described by a `template.yaml`: runs its `setup` steps
   * once in a throwaway sandbox; new sandboxes of the template start from the result.
   */
  async build(path: string, options: ConnectionOptions = {}): Promise<TemplateInfo> {
    return (await client(options, BUILD_TIMEOUT_MS)).json<TemplateInfo>('POST', '/v1/templates', {
      body: { path: resolve(path) },
    });
  },

  async list(options: ConnectionOptions = {}): Promise<TemplateInfo[]> {
    const { templates } = await (await client(options)).json<{ templates: TemplateInfo[] }>(
      'GET',
      '/v1/templates',
    );
    return templates;
  },

  async get(name: string, options: ConnectionOptions = {}): Promise<TemplateInfo> {
    return (await client(options)).json<TemplateInfo>(
      'GET',
      `/v1/templates/${encodeURIComponent(name)}`,
    );
  },

  async remove(name: string, options: ConnectionOptions = {}): Promise<void> {
    await (await client(options)).json('DELETE', `/v1/templates/${encodeURIComponent(name)}`);
  },
};
