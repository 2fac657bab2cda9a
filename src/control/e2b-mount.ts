import type { BodyLimits } from '../../runtime/server/http.js';
import type { E2bBackend, E2bCaller, E2bSandboxRow } from '../compat/e2b/backend.js';
import { E2bControlApi } from '../compat/e2b/control-api.js';
import { egressPolicyOf } from '../providers/provider.js';
import type { KeyService } from './key-service.js';
import type { MetricsSampler } from './metrics.js';
import type { SandboxRecord } from './registry.js';
import type { KeyOwner, SandboxService } from './sandbox-service.js';
import { snapshotSource, type TemplateService } from './template-service.js';

/**
 * E2B's control API over this daemon's services: the compatibility layer declares what it needs
 * (E2bBackend) and this is the one place that answers it with the native services, so the layer
 * adds no state of its own and the native API is untouched.
 */
export function mountE2bControlApi(
  services: {
    sandboxes: SandboxService;
    templates: TemplateService;
    keys: KeyService;
    metrics: MetricsSampler;
  },
  domain: () => string,
  limits: BodyLimits,
): E2bControlApi {
  const { sandboxes, templates, keys, metrics } = services;
  const backend: E2bBackend = {
    authenticate: (key) => keys.authenticateKey(key, 'X-API-KEY: <key> (E2B_API_KEY)'),
    create: async (request, caller) =>
      rowOf((await sandboxes.create(request, keyOwner(caller))).record),
    setNetwork: async (id, network) => rowOf(await sandboxes.setNetwork(id, network)),
    // `get` notices a running row whose processes died, and records it dead.
    get: async (id) => {
      const record = await sandboxes.get(id).catch(() => undefined);
      return record && rowOf(record);
    },
    list: async ({ owner, metadata, states }) =>
      (
        await sandboxes.list({
          state: states,
          metadata,
          ...(owner === undefined ? {} : { owner }),
        })
      ).map(rowOf),
    kill: (id) => sandboxes.kill(id, 'killed', 'killed by request (E2B API)'),
    pause: async (id, memory) =>
      rowOf(await sandboxes.pause(id, memory === undefined ? {} : { memory })),
    resume: async (id, timeoutMs, caller) => {
      const { record, resumed } = await sandboxes.resume(
        id,
        timeoutMs === undefined ? {} : { timeoutMs },
        keyOwner(caller),
      );
      return { row: rowOf(record), resumed };
    },
    fork: async (id, options, caller) =>
      (await sandboxes.fork(id, options, keyOwner(caller))).map(({ record }) => rowOf(record)),
    setTimeout: async (id, timeoutMs) => rowOf(await sandboxes.setTimeout(id, timeoutMs)),
    accessToken: (id) => sandboxes.tokenOf(id),
    template: async (name) => {
      try {
        const { spec } = await templates.get(name);
        return { resources: spec.resources, network: spec.network };
      } catch {
        return undefined;
      }
    },
    snapshots: async () =>
      (await templates.list())
        .map((t) => ({ name: t.spec.name, sandboxId: snapshotSource(t.spec), builtAt: t.builtAt }))
        .filter((t): t is { name: string; sandboxId: string; builtAt: number } => !!t.sandboxId)
        .sort((a, b) => a.builtAt - b.builtAt || (a.name < b.name ? -1 : 1)),
    snapshot: async (id, name, caller) => {
      keys.requireAdmin(caller, 'saving a sandbox as a template (shared by every key)');
      const record = await sandboxes.running(id);
      const built = await templates.snapshot(record, sandboxes.controlTokenOf(id), name);
      await sandboxes.drainPool(built.spec.name);
    },
    removeTemplate: async (name, caller) => {
      keys.requireAdmin(caller, 'removing a template (shared by every key)');
      await templates.remove(name);
      await sandboxes.drainPool(name);
    },
    metrics: (id, start, end) => metrics.samples(id, start, end),
    domain,
  };
  return new E2bControlApi(backend, limits);
}

/** The key a create or resume counts against (none: the daemon's own key). */
function keyOwner(caller: E2bCaller): KeyOwner | undefined {
  return caller.keyId === null
    ? undefined
    : { keyId: caller.keyId, name: caller.name, maxRunning: caller.maxRunning };
}

/** A registry row as the E2B layer reads it: an internet sandbox's policy comes from its handle. */
function rowOf(record: SandboxRecord): E2bSandboxRow {
  const policy = egressPolicyOf(record.handle);
  return policy
    ? { ...record, network: { allowOut: policy.allowOut, denyOut: policy.denyOut } }
    : record;
}
