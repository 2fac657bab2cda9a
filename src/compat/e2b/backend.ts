/**
 * What the E2B control API needs of abx, declared here so this layer never imports the control
 * plane: the daemon hands it an object built from its own services (src/control/e2b-mount.ts).
 * Every call lands on the native service, registry and key store; the layer keeps no state.
 */
import type { BuildProgress, TemplateResources } from '../../../runtime/protocol/wire.js';
import type { HostRules } from '../../egress/header-rules.js';
import type { MetricsSample, VolumeFiles, VolumeSpec } from '../../providers/provider.js';
import type { LogLine } from '../../util/log-lines.js';

/** Who sent a request: the key its `X-API-KEY` names. */
export interface E2bCaller {
  /** The key's id; null for the daemon's own key. */
  keyId: string | null;
  name: string;
  admin: boolean;
  maxRunning: number | null;
}

/** What a template gives each of its sandboxes: limits and network. */
export interface E2bTemplateTraits {
  resources: TemplateResources;
  /** `host`: the host's network; `none`: loopback only; `internet`: egress by policy. */
  network: 'none' | 'host' | 'internet';
  /** The folders a volume may be mounted inside in its sandboxes (its home, /tmp, /mnt). */
  mountRoots: string[];
}

/** A template another is built on (E2B's `fromTemplate`): its image and the settings it gives. */
export interface E2bTemplateBase {
  image: string;
  env: Record<string, string>;
  user: string;
  workdir: string;
}

/** A volume as E2B's API names it: abx's id (`vol_…`) and the name the key gave it. */
export interface E2bVolume {
  id: string;
  name: string;
}

/** A secret as E2B's API shows it: never its value. */
export interface E2bSecret {
  id: string;
  name: string;
  version: number;
  metadata: Record<string, string>;
  createdAt: number;
  updatedAt: number;
}

/** A lifecycle event as abx records it (docs/events.md), for E2B's `/events/sandboxes`. */
export interface E2bEvent {
  id: string;
  type: string;
  /** Ms since the epoch. */
  at: number;
  sandboxId: string;
  /** The owning key's id; null for the daemon's own key. */
  owner: string | null;
  template: string;
  data: Record<string, unknown>;
}

/** A read of E2B's `/events/sandboxes` (its query, checked), of one sandbox or all. */
export interface E2bEventQuery {
  offset: number;
  limit: number;
  orderAsc: boolean;
  /** The `types` asked for, as given (the backend checks them; none: E2B's six). */
  types: string[];
  sandboxId?: string;
}

/** A webhook as E2B's API shows it (`/events/webhooks`): never its secret. */
export interface E2bWebhook {
  id: string;
  /** The key that registered it (E2B's team); null for the daemon's own key. */
  owner: string | null;
  name: string;
  url: string;
  enabled: boolean;
  events: string[];
  createdAt: number;
}

/** A volume mounted in a sandbox, as E2B's `volumeMounts` entries say. */
export interface E2bVolumeMount {
  name: string;
  path: string;
}

/**
 * An egress policy, as E2B's `network.allowOut`, `denyOut`, `rules` (placeholders, never
 * secret values; docs/network.md) and `egressProxy` (the user's SOCKS5 proxy: with its password
 * when set, never with it in a row, which is what answers are made of).
 */
export interface E2bNetwork {
  allowOut: string[];
  denyOut: string[];
  rules?: HostRules;
  egressProxy?: { address: string; username?: string; password?: string };
}

/** A sandbox as the registry holds it (the fields the E2B answers are made of). */
export interface E2bSandboxRow {
  id: string;
  template: string;
  state: string;
  metadata: Record<string, string>;
  createdAt: number;
  expiresAt: number;
  owner: string | null;
  /** An internet sandbox's policy; none: its template's network without one (none or host). */
  network?: E2bNetwork;
  /** Set while paused: frozen with its memory (`memory: true`) or hibernated, and since when. */
  paused?: { memory: boolean; at: number } | null;
  /** Set when its timeout pauses it (`autoPause`) instead of killing it. */
  lifecycle?: { onTimeout: 'pause'; keepMemory: boolean; autoResume?: boolean } | null;
  /** The volumes it mounts. */
  volumeMounts?: readonly E2bVolumeMount[];
}

/** The two ends of a request's TCP connection, as Node's socket has them. */
export interface E2bConnection {
  localAddress?: string | undefined;
  localPort?: number | undefined;
  remoteAddress?: string | undefined;
  remotePort?: number | undefined;
}

/** The states a sandbox is listed in (E2B's `state` query). */
export type E2bListedState = 'running' | 'paused';

export interface E2bBackend {
  /** The caller a key names; AuthenticationError (401) for a missing, wrong or revoked key. */
  authenticate(key: string | undefined): Promise<E2bCaller>;
  /** Creates a running sandbox for the caller (LimitExceededError at its `maxRunning`). */
  create(
    request: {
      template: string;
      timeoutMs?: number;
      envs: Record<string, string>;
      metadata: Record<string, string>;
      network?: Partial<E2bNetwork>;
      allowInternetAccess?: boolean;
      /** True: its timeout pauses it instead of killing it. */
      autoPause?: boolean;
      /** With `autoPause`: keep its memory (freeze) or only its disk (hibernate). */
      autoPauseMemory?: boolean;
      /** With `autoPause`: a request for it resumes it when paused. */
      autoResume?: boolean;
      /**
       * The caller's volumes to mount, by name (checked again by the native create); `readOnly`
       * is abx's own, passed on as sent.
       */
      volumeMounts?: (E2bVolumeMount & { readOnly?: unknown })[];
      /** A host folder mounted copy-on-write (metadata `abx.workspace`; docs/workspaces.md). */
      workspace?: { from: string; path?: string };
    },
    caller: E2bCaller,
    /** The request's connection (its local client's user may mount what it can read). */
    connection?: E2bConnection,
  ): Promise<E2bSandboxRow>;
  /** Replaces a running internet sandbox's egress policy (InvalidArgumentError on another). */
  setNetwork(id: string, network: E2bNetwork): Promise<E2bSandboxRow>;
  /** The row of a sandbox as it is, or undefined; a running one whose processes died reads dead. */
  get(id: string): Promise<E2bSandboxRow | undefined>;
  /** Sandboxes in any of `states`, oldest first; of one key only with `owner`. */
  list(filter: {
    owner?: string;
    metadata: Record<string, string>;
    states: readonly E2bListedState[];
  }): Promise<E2bSandboxRow[]>;
  /** Kills a running or paused sandbox; false when it had ended already. */
  kill(id: string): Promise<boolean>;
  /**
   * Pauses a running sandbox: `memory` true (the default) freezes it with its memory, false
   * hibernates it (its disk kept). SandboxPausedError (409) when it is paused already.
   */
  pause(id: string, memory: boolean | undefined): Promise<E2bSandboxRow>;
  /**
   * Runs a paused sandbox again for `timeoutMs` (default: its template's timeout), counted
   * against the caller's limit when it is the caller's; a running one is answered as it is,
   * `resumed: false`.
   */
  resume(
    id: string,
    timeoutMs: number | undefined,
    caller: E2bCaller,
  ): Promise<{ row: E2bSandboxRow; resumed: boolean }>;
  /**
   * `count` new running sandboxes on copies of a running or paused sandbox's disk, the caller's,
   * for `timeoutMs` each (default: the template's); all start or none is left.
   */
  fork(
    id: string,
    options: { count: number; timeoutMs?: number },
    caller: E2bCaller,
  ): Promise<E2bSandboxRow[]>;
  /** Sets the time left of a running sandbox. */
  setTimeout(id: string, timeoutMs: number): Promise<E2bSandboxRow>;
  /** The token a sandbox's users present to its envd (the native access token). */
  accessToken(id: string): string;
  /**
   * What a template gives its sandboxes; undefined when there is no such template, or (with
   * `caller`) when it is another key's own, which the caller may not see.
   */
  template(name: string, caller?: E2bCaller): Promise<E2bTemplateTraits | undefined>;
  /**
   * Saves a running sandbox as the template `name`, the caller's own (as on /v1; 409 for a name
   * another key's template has).
   */
  snapshot(id: string, name: string, caller: E2bCaller): Promise<void>;
  /**
   * The snapshots (templates saved from sandboxes) the caller may use, oldest first, with the
   * sandbox of each: its own and shared ones; every one for an admin key.
   */
  snapshots(caller: E2bCaller): Promise<{ name: string; sandboxId: string; builtAt: number }[]>;
  /**
   * Removes a template, a snapshot's included: the caller's own; a shared one or another key's,
   * admin keys only (as on /v1); 404 if none or the caller may not see it.
   */
  removeTemplate(name: string, caller: E2bCaller): Promise<void>;
  /**
   * Builds the template a `template.yaml` text describes, as the caller: abx's own build, with
   * its refusals and owners (template-access.ts). `uploaded` is a folder of the caller's own
   * uploaded files, which the template's copy steps may copy from. `fromTemplate` names the
   * template whose image the text starts from (E2B's `fromTemplate`): checked again as the caller
   * may use it, its image is then allowed to a key that is no admin.
   */
  buildTemplate(
    yaml: string,
    caller: E2bCaller,
    onProgress: (event: BuildProgress) => void,
    uploaded?: string,
    fromTemplate?: string,
  ): Promise<void>;
  /**
   * The image template `name` as `caller` may use it, to build another on (E2B's
   * `fromTemplate`): a NotFoundError as for an unknown name when it may not use it, an
   * InvalidArgumentError naming why when it is no image template to start from.
   */
  templateBase(name: string, caller: E2bCaller): Promise<E2bTemplateBase>;
  /** The folder E2B's template files are kept in (blobs by content hash, and build staging). */
  templateFilesDir(): string;
  /**
   * Why this daemon's sandboxes cannot have root inside (`allow_root`), or undefined when they
   * can: E2B-built templates allow root where it can be given, as E2B's sandboxes have it.
   * Left out: they cannot.
   */
  rootUnavailable?(): string | undefined;
  /**
   * A running sandbox's samples of use from `start` to `end` (ms since the epoch, both included),
   * oldest first; empty where the provider measures none.
   */
  metrics(id: string, start?: number, end?: number): MetricsSample[];
  /** The lines kept of a sandbox's log, running or ended, oldest first (none: empty). */
  logs(id: string): LogLine[];
  /** The domain sandbox hosts end with: `{port}-{sandboxId}.{domain}` at the gateway. */
  domain(): string;
  /**
   * The template E2B's `base` names on this daemon (`ABX_E2B_BASE_TEMPLATE`), such as an image
   * template that allows root, as E2B's own `base` is; undefined: abx's `base`.
   */
  baseTemplate?(): string | undefined;
  /** Makes a volume of the caller's (InvalidArgumentError for a bad name; 409 for a taken one). */
  createVolume(name: unknown, caller: E2bCaller): Promise<E2bVolume>;
  /** The caller's volumes, oldest first. */
  listVolumes(caller: E2bCaller): Promise<E2bVolume[]>;
  /** The caller's volume of that id; VolumeNotFoundError (404) for none, another key's too. */
  getVolume(id: string, caller: E2bCaller): Promise<E2bVolume>;
  /** Removes the caller's volume and its files; 404 for none, 409 while a sandbox mounts it. */
  removeVolume(id: string, caller: E2bCaller): Promise<void>;
  /** The token of a volume's content API (derived, never stored). */
  volumeToken(id: string): string;
  /**
   * Makes a secret of the caller's from `{ name, value, metadata? }` (InvalidArgumentError for
   * bad input, SecretConflictError for a taken name). No secret call ever answers a value.
   */
  createSecret(body: Record<string, unknown>, caller: E2bCaller): Promise<E2bSecret>;
  /** The secrets the caller may see (an admin key: every key's). */
  listSecrets(caller: E2bCaller): Promise<E2bSecret[]>;
  /** A secret by id or name; SecretNotFoundError (404) for none, another key's too. */
  getSecret(ref: string, caller: E2bCaller): Promise<E2bSecret>;
  /** A new value (the next version) and/or metadata from `{ value?, metadata? }`. */
  updateSecret(ref: string, body: Record<string, unknown>, caller: E2bCaller): Promise<E2bSecret>;
  /** Removes a secret and its versions; SecretNotFoundError (404) for none. */
  removeSecret(ref: string, caller: E2bCaller): Promise<void>;
  /**
   * Webhooks of the caller's key (E2B's `/events/webhooks`; abx's WebhookService): the body is
   * E2B's `{ name, url, enabled, events, signatureSecret }`; another key's webhook is 404.
   */
  createWebhook(body: Record<string, unknown>, caller: E2bCaller): Promise<E2bWebhook>;
  listWebhooks(caller: E2bCaller): Promise<E2bWebhook[]>;
  getWebhook(id: string, caller: E2bCaller): Promise<E2bWebhook>;
  updateWebhook(id: string, body: Record<string, unknown>, caller: E2bCaller): Promise<E2bWebhook>;
  removeWebhook(id: string, caller: E2bCaller): Promise<void>;
  /**
   * Lifecycle events of the caller's sandboxes (an admin key: all), by seq; one sandbox's with
   * `sandboxId` (another key's: SandboxNotFoundError, as an unknown id).
   */
  listEvents(query: E2bEventQuery, caller: E2bCaller): Promise<E2bEvent[]>;
  /**
   * The volume whose content token `token` is, while it exists and its key is not revoked;
   * undefined otherwise (a wrong token and an unknown volume alike).
   */
  volumeOfToken(id: string, token: string | undefined): Promise<VolumeSpec | undefined>;
  /** The provider's way to volumes' files (InvalidArgumentError where it has none). */
  volumeFiles(): VolumeFiles;
}
