import type { BodyLimits } from '../../runtime/server/http.js';
import type {
  E2bBackend,
  E2bCaller,
  E2bSandboxRow,
  E2bSecret,
  E2bTemplateBase,
  E2bVolume,
  E2bWebhook,
} from '../compat/e2b/backend.js';
import { E2bControlApi } from '../compat/e2b/control-api.js';
import { publicPolicy } from '../egress/policy.js';
import { InvalidArgumentError, VolumeNotFoundError } from '../errors.js';
import { egressPolicyOf, sandboxHome } from '../providers/provider.js';
import { type EventService, e2bEventTypes } from './event-service.js';
import { hashToken, tokenMatches } from './ids.js';
import type { KeyService } from './key-service.js';
import type { MetricsSampler } from './metrics.js';
import { loopbackPeerUid } from './peer-uid.js';
import type { SandboxRecord, SecretRecord, VolumeRecord } from './registry.js';
import type { SandboxLogs } from './sandbox-logs.js';
import type { KeyOwner, SandboxService } from './sandbox-service.js';
import type { SecretService } from './secret-service.js';
import { type BuiltTemplate, snapshotSource, type TemplateService } from './template-service.js';
import { mountRoots, type VolumeService } from './volume-service.js';
import type { WebhookService } from './webhook-service.js';
import type { WebhookRecord } from './webhook-store.js';

/**
 * What E2B's `fromTemplate` builds on: an image template's image, env, user and workdir. A
 * template without an image of its own, or a snapshot (its home is kept apart from its image), is
 * refused by name.
 */
function templateBase(template: BuiltTemplate, name: string): E2bTemplateBase {
  const quoted = JSON.stringify(name);
  if (!template.image) {
    throw new InvalidArgumentError(
      `fromTemplate(${quoted}) is not supported by abx for this template: it has no image of its own (abx's base, or a template without image:), and abx builds only on image templates; start from an image with fromImage; nothing was built`,
    );
  }
  if (template.homeDir) {
    throw new InvalidArgumentError(
      `fromTemplate(${quoted}) is not supported by abx for this template: it is a snapshot, whose home folder abx keeps apart from its image, so a template built on it would lack those files; create sandboxes from the snapshot itself, or start from an image with fromImage; nothing was built`,
    );
  }
  return {
    image: template.image,
    env: template.spec.env,
    user: template.spec.user,
    workdir: template.spec.workdir,
  };
}

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
    logs: SandboxLogs;
    volumes: VolumeService;
    /** Secrets: the same service, ownership and write-only rule as /v1/secrets. */
    secrets: SecretService;
    /** Webhooks: the same service and ownership rule as /v1/webhooks (E2B's flavour). */
    webhooks: WebhookService;
    /** Lifecycle events: the same records and owner rule as /v1/events. */
    events: EventService;
    /** A volume's content token (ids.ts volumeToken with the installation's secret). */
    volumeToken: (id: string) => string;
  },
  domain: () => string,
  limits: BodyLimits,
): E2bControlApi {
  const { sandboxes, templates, keys, metrics, logs, volumes, secrets, webhooks, volumeToken } =
    services;
  const { events } = services;
  const backend: E2bBackend = {
    authenticate: (key) => keys.authenticateKey(key, 'X-API-KEY: <key> (E2B_API_KEY)'),
    create: async (request, caller, connection) =>
      rowOf(
        (
          await sandboxes.create(request, keyOwner(caller), {
            uid: connection ? loopbackPeerUid(connection) : undefined,
          })
        ).record,
      ),
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
    template: async (name, caller) => {
      try {
        const { spec } = await templates.get(name, caller);
        return {
          resources: spec.resources,
          network: spec.network,
          mountRoots: mountRoots(sandboxHome(spec.user)),
        };
      } catch {
        return undefined;
      }
    },
    snapshots: async (caller) =>
      (await templates.list(caller))
        .map((t) => ({ name: t.spec.name, sandboxId: snapshotSource(t.spec), builtAt: t.builtAt }))
        .filter((t): t is { name: string; sandboxId: string; builtAt: number } => !!t.sandboxId)
        .sort((a, b) => a.builtAt - b.builtAt || (a.name < b.name ? -1 : 1)),
    // Who may take, see and remove a snapshot is TemplateService's one decision, as on /v1.
    snapshot: async (id, name, caller) => {
      const record = await sandboxes.running(id);
      const built = await templates.snapshot(
        record,
        sandboxes.controlTokenOf(id),
        name,
        caller,
        (to) => sandboxes.saveWorkspace(id, to),
      );
      await sandboxes.drainPool(built.spec.name);
    },
    removeTemplate: async (name, caller) => {
      await templates.remove(name, caller);
      await sandboxes.drainPool(name);
    },
    templateBase: async (name, caller) => templateBase(await templates.get(name, caller), name),
    buildTemplate: async (yaml, caller, onProgress, uploaded, fromTemplate) => {
      // Again at the build: the key may still use the template, and only its image is allowed.
      const base =
        fromTemplate === undefined
          ? undefined
          : templateBase(await templates.get(fromTemplate, caller), fromTemplate);
      const built = await templates.build({ yaml }, onProgress, caller, uploaded, base?.image);
      await sandboxes.drainPool(built.spec.name);
    },
    templateFilesDir: () => templates.filesDir,
    rootUnavailable: () => sandboxes.rootUnavailable(),
    baseTemplate: () => process.env.ABX_E2B_BASE_TEMPLATE || undefined,
    metrics: (id, start, end) => metrics.samples(id, start, end),
    logs: (id) => logs.read(id),
    domain,
    createVolume: async (name, caller) => volumeOf(await volumes.create(caller.keyId, { name })),
    listVolumes: async (caller) => (await volumes.list(caller.keyId)).map(volumeOf),
    getVolume: async (id, caller) => volumeOf(await volumes.byId(caller.keyId, id)),
    removeVolume: async (id, caller) => {
      await volumes.remove(await volumes.byId(caller.keyId, id));
    },
    volumeToken,
    volumeOfToken: async (id, token) => {
      const volume = await volumes.byId(undefined, id).catch((error: unknown) => {
        if (error instanceof VolumeNotFoundError) return undefined;
        throw error;
      });
      // Compared as hashes in constant time, as every token of the daemon is.
      if (!volume || !tokenMatches(token, hashToken(volumeToken(volume.id)))) return undefined;
      // A revoked key's volumes are not reached by their tokens any more (an admin removes them).
      if (volume.owner !== null) {
        const key = await keys.get(volume.owner);
        if (!key || key.revokedAt !== null) return undefined;
      }
      return volumes.spec(volume);
    },
    volumeFiles: () => volumes.files(),
    createSecret: async (body, caller) => secretOf(await secrets.create(caller, body)),
    listSecrets: async (caller) => (await secrets.list(caller)).map(secretOf),
    getSecret: async (ref, caller) => secretOf(await secrets.find(caller, ref)),
    updateSecret: async (ref, body, caller) => secretOf(await secrets.update(caller, ref, body)),
    removeSecret: async (ref, caller) => {
      await secrets.remove(caller, ref);
    },
    listEvents: (query, caller) =>
      events.list(caller, {
        offset: query.offset,
        limit: query.limit,
        order: query.orderAsc ? 'asc' : 'desc',
        types: e2bEventTypes(query.types),
        ...(query.sandboxId === undefined ? {} : { sandboxId: query.sandboxId }),
      }),
    createWebhook: async (body, caller) =>
      webhookOf((await webhooks.create(caller, body, 'e2b')).webhook),
    listWebhooks: async (caller) => (await webhooks.list(caller)).map(webhookOf),
    getWebhook: async (id, caller) => webhookOf(await webhooks.get(caller, id)),
    updateWebhook: async (id, body, caller) => webhookOf(await webhooks.update(caller, id, body)),
    removeWebhook: async (id, caller) => {
      await webhooks.remove(caller, id);
    },
  };
  return new E2bControlApi(backend, limits);
}

const volumeOf = (volume: VolumeRecord): E2bVolume => ({ id: volume.id, name: volume.name });

const webhookOf = (webhook: WebhookRecord): E2bWebhook => ({
  id: webhook.id,
  owner: webhook.owner,
  name: webhook.name,
  url: webhook.url,
  enabled: webhook.enabled,
  events: webhook.events,
  createdAt: webhook.createdAt,
});

const secretOf = (secret: SecretRecord): E2bSecret => ({
  id: secret.id,
  name: secret.name,
  version: secret.version,
  metadata: secret.metadata,
  createdAt: secret.createdAt,
  updatedAt: secret.updatedAt,
});

/** The key a create or resume counts against (none: the daemon's own key). */
function keyOwner(caller: E2bCaller): KeyOwner | undefined {
  return caller.keyId === null
    ? undefined
    : {
        keyId: caller.keyId,
        name: caller.name,
        maxRunning: caller.maxRunning,
        admin: caller.admin,
      };
}

/** A registry row as the E2B layer reads it: an internet sandbox's policy comes from its handle. */
function rowOf(record: SandboxRecord): E2bSandboxRow {
  const policy = egressPolicyOf(record.handle);
  const row: E2bSandboxRow = {
    ...record,
    volumeMounts: record.volumeMounts.map(({ name, path }) => ({ name, path })),
  };
  return policy ? { ...row, network: publicPolicy(policy) } : row;
}
