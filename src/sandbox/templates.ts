import { resolve } from 'node:path';
import type { TemplateInfo } from '../../runtime/protocol/wire.js';
import { Template } from '../commands/template-builder.js';
import { InvalidArgumentError } from '../errors.js';
import { type ConnectionOptions, connectDaemon } from '../installation/daemon-connection.js';
import { daemonClient, type HttpClient } from './http-client.js';

export type { TemplateInfo };

/** Building runs setup steps; give it time. */
const BUILD_TIMEOUT_MS = 3_600_000;

async function client(options: ConnectionOptions, timeoutMs?: number): Promise<HttpClient> {
  const connection = await connectDaemon(options);
  return daemonClient(connection, timeoutMs ?? options.requestTimeoutMs ?? 60_000);
}

/** Templates of the local installation: build from a `template.yaml`, list, remove. */
export const Templates = {
  /**
   * Builds (or rebuilds) a template — a `template.yaml` path, or a {@link Template} made in code
   * with its `name` — running its `setup` steps once in a throwaway sandbox; new sandboxes of the
   * template start from the result. A failing step is a `TemplateBuildError` (the step, its exit
   * code, the end of its output) and leaves the previous build in place.
   */
  async build(
    template: string | Template,
    options: ConnectionOptions & { name?: string } = {},
  ): Promise<TemplateInfo> {
    let body: { path: string } | { yaml: string };
    if (template instanceof Template) {
      if (!options.name) {
        throw new InvalidArgumentError(
          'a template made in code needs a name: Templates.build(template, { name: "my-template" })',
        );
      }
      body = { yaml: template.toYaml(options.name) };
    } else body = { path: resolve(template) };
    return (await client(options, BUILD_TIMEOUT_MS)).json<TemplateInfo>('POST', '/v1/templates', {
      body,
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
