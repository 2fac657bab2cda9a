import type { ApiKeyInfo } from '../../runtime/protocol/wire.js';
import { connectControlPlane } from '../installation/control-connection.js';
import type { ConnectionOptions } from '../installation/daemon-connection.js';
import { daemonClient, type HttpClient } from './http-client.js';

export type { ApiKeyInfo };

async function client(options: ConnectionOptions): Promise<HttpClient> {
  return daemonClient(await connectControlPlane(options), options.requestTimeoutMs ?? 60_000);
}

/**
 * API keys of the control plane (the local daemon, or the remote one of `apiUrl` /
 * `ABX_API_URL`); every call needs an admin key. A key that is not an admin sees and controls
 * only the sandboxes it created, up to its `maxRunning`.
 */
export const ApiKeys = {
  /** Makes a key; `key` in the answer is the key itself, which the control plane never shows again. */
  async create(
    name: string,
    options: ConnectionOptions & {
      admin?: boolean;
      maxRunning?: number;
      /** `abx` (default, `abx_…`) or `e2b` (`e2b_` and hex, for E2B's SDKs' `E2B_API_KEY`). */
      format?: 'abx' | 'e2b';
    } = {},
  ): Promise<ApiKeyInfo & { key: string }> {
    const { admin, maxRunning, format } = options;
    return (await client(options)).json<ApiKeyInfo & { key: string }>('POST', '/v1/keys', {
      body: {
        name,
        ...(admin === undefined ? {} : { admin }),
        ...(maxRunning === undefined ? {} : { maxRunning }),
        ...(format === undefined ? {} : { format }),
      },
    });
  },

  /** Every key, revoked ones included, with the sandboxes each has running now. */
  async list(options: ConnectionOptions = {}): Promise<ApiKeyInfo[]> {
    const { keys } = await (await client(options)).json<{ keys: ApiKeyInfo[] }>('GET', '/v1/keys');
    return keys;
  },

  /**
   * Revokes a key by id: it is refused from its next request on. `revoked` is false when it had
   * been revoked before. Its sandboxes run on until they end, unless `kill: true`: then its
   * running and paused sandboxes are killed too (their tokens stop working at the gateway at
   * once), and `killed` lists their ids.
   */
  async revoke(
    id: string,
    options: ConnectionOptions & { kill?: boolean } = {},
  ): Promise<{ revoked: boolean; key: ApiKeyInfo; killed?: string[] }> {
    return (await client(options)).json<{ revoked: boolean; key: ApiKeyInfo; killed?: string[] }>(
      'DELETE',
      `/v1/keys/${encodeURIComponent(id)}${options.kill ? '?kill=true' : ''}`,
    );
  },
};
