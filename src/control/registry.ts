/**
 * Life of a sandbox: `running` until killed, expired (reaped) or found dead. `pooled`: started
 * ahead of demand in the warm pool, not yet handed out (never listed by default). `paused`:
 * frozen or hibernated until resumed (back to `running`), killed, or removed at its paused
 * timeout.
 */
import type { SandboxState } from '../../runtime/protocol/wire.js';
import type { SandboxHandle } from '../providers/provider.js';
import type { AuditStore } from './audit.js';
import type { EventDraft, EventFilter, NewSandboxEvent, SandboxEvent } from './events.js';
import type { WebhookStore } from './webhook-store.js';

export type { SandboxState };

/** One sandbox as the registry records it. */
export interface SandboxRecord {
  id: string;
  template: string;
  state: SandboxState;
  metadata: Record<string, string>;
  createdAt: number;
  expiresAt: number;
  endedAt: number | null;
  /** Why it ended: `killed by API`, `expired`, `found dead after daemon restart`... */
  endReason: string | null;
  /** SHA-256 of the access token, hex: the token itself is never stored. */
  tokenHash: string;
  handle: SandboxHandle;
  capabilities: string[];
  /**
   * The id of the API key that created it (or was handed it from the warm pool); null for the
   * daemon's own key (`$ABX_HOME/api-key`) and for spares not handed out yet.
   */
  owner: string | null;
  /** Set while `paused`: how it is kept and since when. */
  paused: PauseRecord | null;
  /** Set when its timeout pauses it (`autoPause`) instead of killing it. */
  lifecycle: LifecycleRecord | null;
  /** The volumes it mounts (none: `[]`); a volume is in use while a live sandbox names it. */
  volumeMounts: VolumeMountRecord[];
}

/** A volume mounted in a sandbox (what the registry keeps of a create's `volumeMounts`). */
export interface VolumeMountRecord {
  /** The volume's id (its name may be given to another volume after this one is removed). */
  id: string;
  name: string;
  path: string;
  readOnly: boolean;
}

/**
 * What a sandbox's mounts (as the registry keeps them: `JSON.stringify` of its
 * {@link VolumeMountRecord}s, id first, no spaces) hold exactly when one of them is volume `id`:
 * a name or path that looks like an id cannot match, as its quotes would be escaped.
 */
export function volumeNeedle(id: string): string {
  return `"id":${JSON.stringify(id)}`;
}

/** A sandbox's mounts as the registry keeps them (see {@link volumeNeedle}); none: null. */
export function volumeMountsJson(mounts: readonly VolumeMountRecord[]): string | null {
  if (mounts.length === 0) return null;
  return JSON.stringify(
    mounts.map(({ id, name, path, readOnly }) => ({ id, name, path, readOnly })),
  );
}

/** One volume. Names are unique per owner; the id never changes and is never reused. */
export interface VolumeRecord {
  id: string;
  name: string;
  /** The id of the API key that made it; null for the daemon's own key. */
  owner: string | null;
  sizeBytes: number;
  createdAt: number;
}

/** What a volume's removal did: removed it, or found live sandboxes that mount it (`users`). */
export interface VolumeRemoval {
  removed: boolean;
  /** Ids of the running, paused or pooled sandboxes that mount it (removal refused). */
  users: string[];
}

/**
 * One secret: its name, metadata and current version, never its value (that is in its
 * {@link SealedSecretVersion}s, encrypted). Names are unique per owner; the id never changes.
 */
export interface SecretRecord {
  /** `sec_` and 20 hex digits. */
  id: string;
  /** Lower-case (names are case-insensitive, as E2B's). */
  name: string;
  /** The id of the API key that made it; null for the daemon's own key. */
  owner: string | null;
  metadata: Record<string, string>;
  /** The version readers get: 1 at create, one more at each change of the value. */
  version: number;
  createdAt: number;
  updatedAt: number;
}

/** One version of a secret's value as the registry keeps it: sealed (secret-crypto.ts). */
export interface SealedSecretVersion {
  version: number;
  /** base64 of the 12-byte IV, the AES-256-GCM ciphertext and its 16-byte tag. */
  sealed: string;
  /** Which key sealed it: a check value of the key (secret-crypto.ts keyCheck), not the key. */
  keyCheck: string;
  createdAt: number;
}

/** A change of a secret: a new version of its value, new metadata, or both. */
export interface SecretChange {
  /** The version the caller read: the change is written only while it is still the current one. */
  from: number;
  /** The next version (`from + 1`), sealed for it. */
  value?: SealedSecretVersion;
  /** Replaces the metadata. */
  metadata?: Record<string, string>;
  at: number;
}

/** How a paused sandbox is kept. */
export interface PauseRecord {
  /** True: frozen with its memory; false: hibernated, its processes ended, its disk kept. */
  memory: boolean;
  /** When it was paused, in ms since the epoch. */
  at: number;
}

/** A sandbox whose timeout pauses it: with its memory (freeze) or only its disk (hibernate). */
export interface LifecycleRecord {
  onTimeout: 'pause';
  keepMemory: boolean;
  /** True: a request for it through the gateway resumes it (E2B's `autoResume`). */
  autoResume?: boolean;
}

/** One API key of the control plane. The key itself is never stored, only its SHA-256. */
export interface ApiKeyRecord {
  /** `key_` and 12 letters and digits: how `abx keys revoke` names it. */
  id: string;
  name: string;
  /** The first characters of the key (`abx_Xy3kQ9`): not secret, to recognise it in lists. */
  prefix: string;
  /** SHA-256 of the key, hex. */
  keyHash: string;
  /** Sees and controls every sandbox and manages keys. */
  admin: boolean;
  /** The most sandboxes it may have running at once; null: no limit. */
  maxRunning: number | null;
  createdAt: number;
  lastUsedAt: number | null;
  revokedAt: number | null;
}

/** What a key's create is checked against: its id and its limit of running sandboxes. */
export interface SandboxOwner {
  keyId: string;
  maxRunning: number | null;
}

/** One built template. */
export interface TemplateRecord {
  name: string;
  /** The loaded template (JSON), as the daemon needs it to create sandboxes. */
  spec: unknown;
  /** Folder whose `home/` new sandboxes start from, or null when there was nothing to build. */
  dir: string | null;
  /** The image new sandboxes start from (an image template's build), or null. */
  image: string | null;
  builtAt: number;
  /**
   * The id of the API key that built it or took it as a snapshot; null for the daemon's own key
   * and for templates recorded before templates had owners.
   */
  owner: string | null;
  /**
   * In the shared catalogue: every key lists it and creates sandboxes from it. Otherwise only its
   * owner and admin keys see it (template-access.ts decides).
   */
  shared: boolean;
}

export interface SandboxFilter {
  /** One state or any of several; without it, every state but `pooled`. */
  state?: SandboxState | readonly SandboxState[];
  template?: string;
  /** Every key must match. */
  metadata?: Record<string, string>;
  /** Only the sandboxes of this API key id. */
  owner?: string;
}

/** The states a sandbox ends in. */
export type EndState = Exclude<SandboxState, 'running' | 'pooled' | 'paused'>;

/**
 * The control plane's state: sandboxes and templates. Two stores implement it: SQLite in
 * `$ABX_HOME` (the embedded default, one daemon) and PostgreSQL (`ABX_DATABASE_URL`, shared by
 * several daemons). Every change of a sandbox's state is one conditional statement, so two
 * callers racing (two daemons, or a kill and the reaper) never both win: the one that loses is
 * told (false / undefined) and its caller answers from the row as the winner left it.
 *
 * The methods that change a sandbox's row take an optional `event` (events.ts EventDraft): it is
 * written, with the row's id, owner and template, in the same transaction as the change, and
 * only when the change is made (a change refused or failed leaves no event).
 */
export interface Registry extends AuditStore {
  /** `sqlite` or `postgres`. */
  readonly kind: 'sqlite' | 'postgres';
  /** Where the state is, for messages: a file, or the URL without its password. */
  readonly location: string;

  /** Creates or upgrades the tables (see migrations.ts); the daemon calls it once at start. */
  migrate(): Promise<void>;

  /**
   * Records a sandbox. A sandbox that mounts volumes is written only while they all still exist.
   * With `maxRunning`, a running row is written only while its owner has fewer
   * running sandboxes than that, counted and written under one lock (SQLite's write lock, a row
   * lock on the key in PostgreSQL): false when the limit is reached, and nothing is written.
   */
  insertSandbox(
    record: SandboxRecord,
    maxRunning?: number | null,
    event?: EventDraft,
  ): Promise<boolean>;
  getSandbox(id: string): Promise<SandboxRecord | undefined>;
  /**
   * The same as `getSandbox` without leaving the thread, when the store can (SQLite): the
   * gateway's lookup per connection. Absent on stores that need a round trip.
   */
  getSandboxNow?(id: string): SandboxRecord | undefined;
  /** Without a state: every sandbox but the pooled ones; oldest first. */
  listSandboxes(filter?: SandboxFilter): Promise<SandboxRecord[]>;
  /**
   * Hands out the oldest pooled sandbox of a template: it becomes `running` with the caller's
   * metadata, lifetime and owner. One statement, so two concurrent creates never get the same
   * one; with an owner whose `maxRunning` is reached, none is handed out (undefined).
   */
  claimPooled(
    template: string,
    metadata: Record<string, string>,
    now: number,
    expiresAt: number,
    owner?: SandboxOwner,
    event?: EventDraft,
  ): Promise<SandboxRecord | undefined>;
  countPooled(template: string): Promise<number>;
  /** Sandboxes that have not ended (every state the table holds), counted by state and template. */
  countLive(): Promise<{ state: SandboxState; template: string; count: number }[]>;
  /**
   * Removes a row for good if it is still in `state` (a pooled sandbox leaving the pool, or one
   * just claimed that turned out dead); false when another caller changed it first.
   */
  deleteSandbox(id: string, state: 'pooled' | 'running', event?: EventDraft): Promise<boolean>;
  /**
   * Marks a running or paused sandbox ended; false when it was neither (it ended already, and
   * the first end stays). `expiredBy`: end it only if its expiry is at or before this time (a
   * lifetime extended meanwhile wins over the reaper).
   */
  endSandbox(
    id: string,
    state: EndState,
    reason: string,
    options?: { expiredBy?: number; event?: EventDraft },
  ): Promise<boolean>;
  /**
   * A running sandbox becomes `paused` (kept as `pause` says) until `expiresAt` (its paused
   * timeout); false when it was not running.
   */
  pauseSandbox(
    id: string,
    pause: PauseRecord,
    expiresAt: number,
    event?: EventDraft,
  ): Promise<boolean>;
  /**
   * A paused sandbox runs again, with `handle` (a hibernated one has new processes) until
   * `expiresAt`. With `maxRunning`, only while its owner has fewer running sandboxes than that
   * (counted and written under one lock, as `insertSandbox`); false when it was not paused or
   * the limit is reached (the row says which).
   */
  resumeSandbox(
    id: string,
    handle: SandboxHandle,
    expiresAt: number,
    maxRunning?: number | null,
    event?: EventDraft,
  ): Promise<boolean>;
  /** Records what a running sandbox's timeout does; false when it is not running. */
  setLifecycle(id: string, lifecycle: LifecycleRecord | null): Promise<boolean>;
  /** Sets a running sandbox's expiry; false when it is not running. */
  setExpiry(id: string, expiresAt: number, event?: EventDraft): Promise<boolean>;
  /** Replaces a running sandbox's handle (its network policy changed); false when not running. */
  setHandle(id: string, handle: SandboxHandle, event?: EventDraft): Promise<boolean>;
  /** Running and paused sandboxes whose time is up (a paused one's: its paused timeout). */
  expired(now?: number): Promise<SandboxRecord[]>;
  /** Sandboxes that ended (killed, expired, dead) at or after `since`, oldest end first. */
  endedSince(since: number): Promise<SandboxRecord[]>;

  /**
   * Records a build; resolves to the build it replaced (read in the same transaction). A new
   * name gets the record's `owner` and `shared`; a rebuild keeps those of the row it replaces.
   * `check` is called once, in the transaction, with that row (undefined: none), while no other
   * write of that name can start: what it throws is thrown and nothing is written, so two keys
   * racing for one name never write into each other's (a build puts its files in place there).
   * `event` (a snapshot's `checkpointed`) is appended in the same transaction: written with the
   * template or not at all.
   */
  upsertTemplate(
    record: TemplateRecord,
    check?: (previous: TemplateRecord | undefined) => void,
    event?: NewSandboxEvent,
  ): Promise<TemplateRecord | undefined>;
  /** Puts a template in the shared catalogue or takes it out; undefined when there is none. */
  setTemplateShared(name: string, shared: boolean): Promise<TemplateRecord | undefined>;
  getTemplate(name: string): Promise<TemplateRecord | undefined>;
  listTemplates(): Promise<TemplateRecord[]>;
  /** Removes a template; resolves to the removed record, or undefined when there was none. */
  removeTemplate(name: string): Promise<TemplateRecord | undefined>;

  /** Records a new key; false (nothing written) when a key that is not revoked has its name. */
  insertApiKey(record: ApiKeyRecord): Promise<boolean>;
  /** The key whose SHA-256 is `keyHash`, revoked or not. */
  findApiKey(keyHash: string): Promise<ApiKeyRecord | undefined>;
  /** The key with this id, revoked or not. */
  getApiKey(id: string): Promise<ApiKeyRecord | undefined>;
  /** Every key, oldest first, with the number of sandboxes each has running now. */
  listApiKeys(): Promise<(ApiKeyRecord & { running: number })[]>;
  /**
   * Revokes a key (the first revocation's time stays); resolves to the key as it is now, or
   * undefined when there is no key of that id.
   */
  revokeApiKey(id: string, now: number): Promise<ApiKeyRecord | undefined>;
  /** Records that a key was used at `now`. */
  touchApiKey(id: string, now: number): Promise<void>;

  /** Records a volume; false when its owner has one of that name already. */
  insertVolume(record: VolumeRecord): Promise<boolean>;
  getVolume(id: string): Promise<VolumeRecord | undefined>;
  /** The volume `name` of `owner` (null: the daemon's own key). */
  findVolume(owner: string | null, name: string): Promise<VolumeRecord | undefined>;
  /** The volumes of `owner` (null: the daemon's own key) by name; every volume without one. */
  listVolumes(owner?: string | null): Promise<VolumeRecord[]>;
  /** Ids of the live (running, paused, pooled) sandboxes that mount the volume. */
  volumeUsers(id: string): Promise<string[]>;
  /**
   * Deletes a volume's row unless a live sandbox mounts it, in one locked step with
   * {@link insertSandbox}: a create that mounts it either committed first (and the removal is
   * refused, naming it) or finds the volume gone (and records nothing).
   */
  removeVolume(id: string): Promise<VolumeRemoval>;

  /** Records a secret and its first version; false (nothing written) when its owner has its name. */
  insertSecret(record: SecretRecord, first: SealedSecretVersion): Promise<boolean>;
  getSecret(id: string): Promise<SecretRecord | undefined>;
  /** The secret `name` of `owner` (null: the daemon's own key). */
  findSecret(owner: string | null, name: string): Promise<SecretRecord | undefined>;
  /** The secrets of `owner` (null: the daemon's own key) by name; every secret without one. */
  listSecrets(owner?: string | null): Promise<SecretRecord[]>;
  /**
   * Changes a secret if its current version is still `change.from` (one conditional step with
   * the new version's row): the secret as it is now, or undefined when it is gone or another
   * change came first (the caller reads it again and retries).
   */
  updateSecret(id: string, change: SecretChange): Promise<SecretRecord | undefined>;
  /** The current version of a secret's value, sealed; undefined when the secret is gone. */
  currentSecretVersion(id: string): Promise<SealedSecretVersion | undefined>;
  /** Removes a secret and every version of it; false when it was gone already. */
  removeSecret(id: string): Promise<boolean>;
  /** The distinct key checks of the versions stored (which keys sealed them). */
  secretKeyChecks(): Promise<string[]>;

  /**
   * Records an event that is not a change of a sandbox's row (it failed to start, its timeout is
   * near, it was snapshotted); resolves to it with its `seq`. An event whose id is recorded
   * already is not written again: the one recorded is answered (an id made from what the event
   * is about writes it once, whichever daemon tries). On PostgreSQL every event insert
   * takes events.ts' EVENTS_LOCK first, so `seq` grows in commit order.
   */
  appendEvent(event: NewSandboxEvent): Promise<SandboxEvent>;
  /** Events as `filter` says, by `seq`. */
  listEvents(filter: EventFilter): Promise<SandboxEvent[]>;
  /** Removes the events that happened before `before` (ms since the epoch); resolves to how many. */
  purgeEvents(before: number): Promise<number>;

  /**
   * A value the daemons sharing this registry agree on: the first daemon's `value` is kept and
   * every later call answers it (how replicas check they derive the same tokens).
   */
  agree(key: string, value: string): Promise<string>;

  /** Webhooks and their deliveries (webhook-store.ts). */
  readonly webhooks: WebhookStore;

  close(): Promise<void>;
}
