import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import type { BuildProgress, TemplateInfo } from '../../runtime/protocol/wire.js';
import { Template } from '../commands/template-builder.js';
import { errorFromBody, InvalidArgumentError, UpstreamError } from '../errors.js';
import { connectControlPlane, remoteControlPlane } from '../installation/control-connection.js';
import type { ConnectionOptions } from '../installation/daemon-connection.js';
import { ndjsonLines } from '../util/ndjson.js';
import { daemonClient, type HttpClient } from './http-client.js';

export type { TemplateInfo };

/**
 * A `template.yaml` to send to a remote control plane as text. A `dockerfile:` names a file on
 * this host, which the control plane cannot read: refused with what to do instead.
 */
function readTemplateForRemote(file: string): string {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (error) {
    throw new InvalidArgumentError(`cannot read template ${file}: ${(error as Error).message}`);
  }
  if (/^dockerfile\s*:/m.test(text)) {
    throw new InvalidArgumentError(
      `${file} builds from a dockerfile on this host, which a remote control plane cannot read: use image: instead, or build it on the control plane's host`,
    );
  }
  return text;
}

/** Building runs setup steps; give it time. */
const BUILD_TIMEOUT_MS = 3_600_000;

async function client(options: ConnectionOptions, timeoutMs?: number): Promise<HttpClient> {
  const connection = await connectControlPlane(options);
  return daemonClient(connection, timeoutMs ?? options.requestTimeoutMs ?? 60_000);
}

/**
 * Templates of the control plane (the local daemon, or the remote one of `apiUrl` /
 * `ABX_API_URL`): build from a `template.yaml`, list, remove, publish. A template built by a key
 * that is not an admin, and every snapshot, is that key's own (its owner and admin keys see it);
 * admin keys' builds are the shared catalogue every key uses (`shared` in {@link TemplateInfo}).
 */
export const Templates = {
  /**
   * Builds (or rebuilds) a template — a `template.yaml` path, or a {@link Template} made in code
   * with its `name` — running its `setup` steps once in a throwaway sandbox; new sandboxes of the
   * template start from the result. A failing step is a `TemplateBuildError` (the step, its exit
   * code, the end of its output) and leaves the previous build in place.
   */
  async build(
    template: string | Template,
    options: ConnectionOptions & {
      name?: string;
      /** Called as the build goes: preparing the image, each setup step, saving the result. */
      onProgress?: (event: BuildProgress) => void;
    } = {},
  ): Promise<TemplateInfo> {
    let body: { path: string } | { yaml: string };
    if (template instanceof Template) {
      if (!options.name) {
        throw new InvalidArgumentError(
          'a template made in code needs a name: Templates.build(template, { name: "my-template" })',
        );
      }
      body = { yaml: template.toYaml(options.name) };
    } else if (remoteControlPlane(options)) {
      // A remote control plane cannot read this host's files: the YAML goes as text.
      body = { yaml: readTemplateForRemote(resolve(template)) };
    } else body = { path: resolve(template) };
    const http = await client(options, BUILD_TIMEOUT_MS);
    if (!options.onProgress) return http.json<TemplateInfo>('POST', '/v1/templates', { body });
    const response = await http.send('POST', '/v1/templates', {
      body: { ...body, progress: true },
    });
    let result: TemplateInfo | undefined;
    for await (const line of ndjsonLines(response.body)) {
      const event = line as {
        progress?: BuildProgress;
        template?: TemplateInfo;
        error?: unknown;
        status?: number;
      };
      if (event.progress) options.onProgress(event.progress);
      else if (event.template) result = event.template;
      else if (event.error) throw errorFromBody(event.status ?? 500, event.error);
    }
    if (!result)
      throw new UpstreamError("the daemon ended the build's answer before saying how it ended");
    return result;
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

  /**
   * Removes a template: a key its own; one in the shared catalogue, or another key's, needs an
   * admin key (another key's own answers as a name that does not exist).
   */
  async remove(name: string, options: ConnectionOptions = {}): Promise<void> {
    await (await client(options)).json('DELETE', `/v1/templates/${encodeURIComponent(name)}`);
  },

  /**
   * Puts a template (a key's own, a snapshot) into the shared catalogue, so every key lists it
   * and creates sandboxes from it; `shared: false` takes it back out (its owner and admins only).
   * Needs an admin key.
   */
  async publish(
    name: string,
    options: ConnectionOptions & { shared?: boolean } = {},
  ): Promise<TemplateInfo> {
    return (await client(options)).json<TemplateInfo>(
      'POST',
      `/v1/templates/${encodeURIComponent(name)}/publish`,
      { body: { shared: options.shared ?? true } },
    );
  },
};
