import { mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { MAX_SANDBOX_TIMEOUT_MS } from '../../runtime/protocol/constants.js';
import { START_READY_TIMEOUT_MS } from '../commands/template-runtime.js';
import {
  type EgressPolicy,
  type PublicPolicy,
  publicPolicy,
  withoutInternet,
} from '../egress/policy.js';
import type { EgressCounters } from '../egress/service.js';
import {
  AuthenticationError,
  errorResponse,
  InvalidArgumentError,
  LimitExceededError,
  SandboxError,
  SandboxNotFoundError,
  SandboxPausedError,
  VolumeNotFoundError,
} from '../errors.js';
import {
  checkForkCount,
  egressPolicyOf,
  rootUnavailableOn,
  type SandboxHandle,
  type SandboxProvider,
  type SandboxSpec,
  sandboxHome,
  type VolumeMountSpec,
} from '../providers/provider.js';
import type { ApplyResult, WorkspaceChanges, WorkspaceDiff } from '../workspace/index.js';
import { BackgroundLog } from './background-log.js';
import {
  holdEnvdAwake,
  prestartServer,
  sandboxEnv,
  startTemplateCommand,
  warmSandbox,
} from './envd-request.js';
import { eventFor, killedData } from './events.js';
import { hashToken, newSandboxId, type TokenKind } from './ids.js';
import { verifySandboxNode } from './node-line.js';
import type { CreateSource, SandboxEvents } from './prometheus.js';
import type { ReaperHost } from './reaper.js';
import type {
  LifecycleRecord,
  Registry,
  SandboxFilter,
  SandboxOwner,
  SandboxRecord,
  VolumeMountRecord,
} from './registry.js';
import {
  type CreateSandboxRequest,
  checkEnvs,
  checkLifecycle,
  checkNetworkPolicy,
  checkStringMap,
  checkTimeout,
} from './sandbox-request.js';
import {
  authorizeWorkspace,
  checkWorkspaceRequest,
  sandboxWorkspaceApply,
  sandboxWorkspaceChanges,
  sandboxWorkspaceDiff,
} from './sandbox-workspace.js';
import {
  keepUploadedBase,
  type SnapshotWorkspace,
  snapshotUpload,
  snapshotWorkspaceRequest,
  type UploadedRequest,
  withSnapshotLayer,
} from './snapshot-workspace.js';
import { StartSlots } from './start-slots.js';
import { DAEMON } from './template-access.js';
import type { BuiltTemplate, TemplateService } from './template-service.js';
import { templateWorkspace } from './template-workspace.js';
import type { VolumeService } from './volume-service.js';
import { WarmPool, type WarmPoolOptions } from './warm-pool.js';
import {
  BASES_DIR,
  checkUploadedWorkspace,
  UploadedBases,
  uploadedWorkspace,
  WorkspaceUploads,
} from './workspace-uploads.js';

/** A new sandbox's volumes: what the registry keeps and what the provider mounts. */
interface SandboxVolumes {
  records: VolumeMountRecord[];
  specs: VolumeMountSpec[];
}

/** The API key a sandbox is created for: its id, its limit, and its name for messages. */
export interface KeyOwner extends SandboxOwner {
  name: string;
  /** An admin key: it may create from every template, another key's own included. */
  admin: boolean;
}

/** The refusal of a create over a key's limit of running sandboxes. */
function limitExceeded(owner: KeyOwner): LimitExceededError {
  return new LimitExceededError(
    `the API key '${owner.name}' (${owner.keyId}) has ${owner.maxRunning} ${owner.maxRunning === 1 ? 'sandbox' : 'sandboxes'} running, its limit (--max-running): kill one of them (abx list, abx kill ID) or ask an admin for a key with a higher limit`,
    { code: 'limit_exceeded' },
  );
}

/** How long a paused sandbox is kept before it is removed, unless the daemon says otherwise. */
export const PAUSED_TIMEOUT_MS = 30 * 24 * 3600 * 1000;

/** What a sandbox was started with, kept in its folder (never its tokens) for a wake. */
type KeptSpec = Omit<SandboxSpec, 'accessToken' | 'controlToken'>;
const SPEC_FILE = 'spec.json';
/**
 * Variables a woken sandbox gets afresh (its proxy's, its id, a pod's address), not from what it
 * had.
 */
const FRESH_ENV = /^(http_proxy|https_proxy|no_proxy|ABX_SANDBOX_ID|ABX_POD_IP)$/i;

/** The refusal of a call that needs a running sandbox, for one that is paused. */
/**
 * Since when a sandbox's workspace changes count (a host edit after it is an apply's conflict):
 * its spec's `since` (a fork's or a snapshot's source mounted them first), else its mount or
 * its create, the earlier (a wake mounts it again later).
 */
function workspaceSince(
  record: { createdAt: number; handle: SandboxHandle },
  spec?: { workspace?: { since?: number } },
): number {
  const mounted = record.handle.workspace?.mountedAt ?? record.createdAt;
  return spec?.workspace?.since ?? Math.min(mounted, record.createdAt);
}

function pausedError(record: SandboxRecord, what = 'is paused'): SandboxPausedError {
  const since = new Date(record.paused?.at ?? record.createdAt).toISOString();
  const kept = record.paused?.memory === false ? 'hibernated' : 'frozen';
  return new SandboxPausedError(
    `sandbox ${record.id} ${what} (${kept} since ${since}): resume it first (sandbox.resume(), Sandbox.connect('${record.id}'), abx resume ${record.id}, or POST /v1/sandboxes/${record.id}/resume)`,
    { code: what === 'is paused' ? 'paused' : 'already_paused' },
  );
}

/** A resume's timeout when it names none and its template is gone. */
const DEFAULT_RESUME_TIMEOUT_MS = 300_000;

/** The warm pool's settings, and how many sandbox starts may be under way at once. */
export interface SandboxPoolOptions extends WarmPoolOptions {
  /** Provider starts under way at once, creates and refills together; default by cores. */
  startConcurrency?: number;
}

/**
 * Sandboxes' life: create, find, kill, extend, and adoption at start (keeping the registry and
 * the host's processes in agreement). The warm pool (warm-pool.ts), the bound on starts under
 * way at once (start-slots.ts), request validation (sandbox-request.ts) and the periodic reaper
 * (reaper.ts) are their own modules.
 */
export class SandboxService {
  /** Sandboxes being killed right now, so a reaper pass and an API call do not race. */
  private readonly ending = new Map<string, Promise<void>>();
  /**
   * Told the id of each sandbox this service ended or took out of the pool (the daemon's gateway
   * forgets what it cached of it).
   */
  onEnded: (id: string) => void = () => {};
  /** Told the id of each sandbox paused or resumed (the gateway forgets its cached record). */
  onChanged: (id: string) => void = () => {};
  /** How long a paused sandbox is kept before it is removed (`--paused-timeout`). */
  pausedTimeoutMs = PAUSED_TIMEOUT_MS;
  /** How long a create waits for its template's `start.ready` (`ABX_START_READY_TIMEOUT_MS`). */
  startReadyTimeoutMs = START_READY_TIMEOUT_MS;
  /** Whether `autoPause` keeps memory when a create does not say (`autoPauseMemory`). */
  autoPauseMemory = true;
  /**
   * The warm pool starts a command server process ahead in each sandbox of a template with ports
   * and shell (`ABX_PRESTART_SERVER`), so the caller's `server.start()` skips Node's start.
   */
  prestartServers = true;
  /** Pauses and resumes under way, by sandbox: one change of a sandbox at a time. */
  private readonly changing = new Map<string, Promise<unknown>>();
  /** Told of each create and end (the daemon's Prometheus metrics); none: nothing is counted. */
  events: SandboxEvents | undefined;
  /** Volumes, for creates with `volumeMounts`; none: such creates are refused. */
  volumes: VolumeService | undefined;

  constructor(
    private readonly registry: Registry,
    private readonly provider: SandboxProvider,
    private readonly templates: TemplateService,
    private readonly sandboxesDir: string,
    /** A token of a sandbox id (derived, never stored): its users' or the control plane's. */
    private readonly tokens: (id: string, kind: TokenKind) => string,
    /** Adds variables to a running sandbox's environment (envd's `PUT /env`). */
    private readonly setEnv: (
      handle: SandboxHandle,
      token: string,
      env: Record<string, string>,
    ) => Promise<void>,
    /** The most sandboxes kept started per template (or the pool's settings); 0: no pool. */
    warmPool: number | SandboxPoolOptions = 1,
  ) {
    const options = typeof warmPool === 'number' ? { max: warmPool } : warmPool;
    this.slots = new StartSlots(options.startConcurrency);
    this.pool = new WarmPool(
      {
        registry,
        slots: this.slots,
        isAlive: (handle) => provider.isAlive(handle),
        template: (name) => templates.get(name),
        start: async (template) =>
          (await this.start(template, 'pooled', {}, {}, MAX_SANDBOX_TIMEOUT_MS)).record,
        release: (record) => this.release(record),
        discard: (record, why) => this.kill(record.id, 'killed', why).then(() => undefined),
        setEnv: (record, env) => setEnv(record.handle, this.controlTokenOf(record.id), env),
        ready: (record) => this.prestartServer(record),
        hold: (record) => holdEnvdAwake(record.handle),
        log: (what, error) => this.log.failed(what, error),
        recovered: (what) => this.log.recovered(what),
      },
      options,
    );
  }

  private readonly pool: WarmPool;
  private uploadsMade: WorkspaceUploads | undefined;
  /** Folders remote clients uploaded, waiting for the create that takes each as its workspace. */
  get uploads(): WorkspaceUploads {
    this.uploadsMade ??= new WorkspaceUploads(join(this.sandboxesDir, '..', 'workspace-uploads'));
    return this.uploadsMade;
  }
  private basesMade: UploadedBases | undefined;
  /** The uploaded workspaces' bases in use, shared by a sandbox and its forks (counted by row). */
  private get bases(): UploadedBases {
    this.basesMade ??= new UploadedBases(join(this.sandboxesDir, '..', BASES_DIR), this.registry);
    return this.basesMade;
  }
  /** Failures of background work (the pool's refills, the reaper's passes). */
  readonly log = new BackgroundLog();
  private readonly slots: StartSlots;

  /** The token a sandbox's users present (through the gateway), limited to its capabilities. */
  tokenOf(id: string): string {
    return this.tokens(id, 'access');
  }

  /** The control plane's token for a sandbox: every envd route (snapshots, the environment). */
  controlTokenOf(id: string): string {
    return this.tokens(id, 'control');
  }

  /**
   * Creates a sandbox for `owner` (an API key; none: the daemon's own key). A key with a limit
   * gets LimitExceededError at it: the count and the write of the row are one locked step in
   * the registry, so concurrent creates (on any replica) never pass it together.
   */
  async create(
    request: CreateSandboxRequest,
    owner?: KeyOwner,
    /** The host uid of the local process that asked (peer-uid.ts); none: remote or unknown. */
    client: { uid?: number | undefined } = {},
  ): Promise<{ record: SandboxRecord; accessToken: string }> {
    const began = performance.now();
    try {
      const { record, source, pooled } = await this.createOnce(request, owner, client);
      await this.refuseIfRevoked(owner, [record.id]);
      this.events?.created(record.template, source, (performance.now() - began) / 1000, pooled);
      return { record, accessToken: this.tokenOf(record.id) };
    } catch (error) {
      // A refused request (4xx) is the caller's; only the daemon's own failures count.
      if (errorResponse(error).status >= 500) this.events?.createFailed(request.template ?? 'base');
      throw error;
    }
  }

  /**
   * Ends what a create or fork made for a key that was revoked while it ran (its request was
   * authenticated before), and refuses the request as a revoked key's. Read after the new rows
   * were written: a revocation with `?kill=true` revokes first and lists the key's sandboxes
   * after, so each sandbox of a revoked key is either in that list or killed here.
   */
  private async refuseIfRevoked(owner: KeyOwner | undefined, ids: string[]): Promise<void> {
    if (!owner) return;
    const key = await this.registry.getApiKey(owner.keyId);
    if (!key || key.revokedAt === null) return;
    for (const id of ids) {
      await this.kill(id, 'killed', `killed: its API key ${key.id} was revoked`).catch(() => false);
    }
    throw new AuthenticationError(
      `the API key '${key.name}' (${key.id}, ${key.prefix}…) was revoked at ${new Date(key.revokedAt).toISOString()}, while this request ran; what it started was killed: ask an admin of the control plane for a new key (abx keys create)`,
      { code: 'key_revoked' },
    );
  }

  private async createOnce(
    request: CreateSandboxRequest,
    owner: KeyOwner | undefined,
    client: { uid?: number | undefined },
  ): Promise<{ record: SandboxRecord; source: CreateSource; pooled: boolean }> {
    // Another key's own template answers as one that is not built (template-access.ts).
    const template = await this.templates.get(
      request.template ?? 'base',
      owner ? { keyId: owner.keyId, admin: owner.admin, name: owner.name } : DAEMON,
    );
    const timeoutMs =
      request.timeoutMs === undefined ? template.spec.timeoutMs : checkTimeout(request.timeoutMs);
    const envs = checkEnvs(request.envs);
    const metadata = checkStringMap('metadata', request.metadata);
    const network = sandboxNetwork(template.spec.name, this.templateNetwork(template), request);
    const lifecycle = this.lifecycleOf(request);
    const name = template.spec.name;
    const volumes = await this.volumeMounts(request.volumeMounts, owner, template);
    // A snapshot's workspace (snapshot-workspace.ts): the folder its source had, checked and
    // authorized below as a create's own; a create from it names none of its own.
    const asked = snapshotWorkspaceRequest(request.workspace, template.spec);
    // A remote client's uploaded folder (workspace-uploads.ts): the key's own, no host folder.
    // A snapshot's uploaded workspace: its kept copy of the base, and its changes.
    const uploaded = checkUploadedWorkspace(
      asked,
      this.provider,
      sandboxHome(template.spec.user),
      volumes.records.map((mount) => mount.path),
    );
    const keptUpload = snapshotUpload(template.spec, template.workspaceLayer);
    if (uploaded && !keptUpload) this.uploads.check(uploaded.upload, owner?.keyId);
    // A template's workspace is checked as the create's own, for the key that creates.
    const workspace =
      uploaded ??
      templateWorkspace(request.workspace, template.spec, () =>
        checkWorkspaceRequest(
          asked ?? template.spec.workspace,
          this.provider,
          sandboxHome(template.spec.user),
          volumes.records.map((mount) => mount.path),
        ),
      );
    // Who may mount that host folder (workspace-access.ts): as whom, or a 403; a snapshot's
    // then starts from the changes it kept.
    const mounted =
      uploaded && keptUpload
        ? { ...uploaded, kept: keptUpload }
        : workspace && 'from' in workspace
          ? withSnapshotLayer(
              await templateWorkspace(request.workspace, template.spec, () =>
                authorizeWorkspace(workspace, owner, client.uid),
              ),
              template.spec,
              template.workspaceLayer,
            )
          : workspace;
    // Refused before a sandbox is started when the limit is plainly reached; the registry's
    // locked write below is what makes the limit hold under concurrent creates.
    if (owner && owner.maxRunning !== null) {
      const running = await this.registry.listSandboxes({ owner: owner.keyId, state: 'running' });
      if (running.length >= owner.maxRunning) throw limitExceeded(owner);
    }
    // The pool refills itself in the background: nothing of it runs on this create's path. Its
    // sandboxes have the template's network and no volumes: one asked with either starts afresh.
    const own = network !== undefined || volumes.records.length > 0 || workspace !== undefined;
    const pooled = own
      ? undefined
      : await this.pool.claim(name, envs, metadata, timeoutMs, true, owner);
    if (pooled) {
      // A provider that ends sandboxes itself (kubernetes' Sandbox shutdownTime) follows the expiry.
      await this.provider.setExpiry?.(pooled.handle, pooled.expiresAt).catch(() => undefined);
      return { record: await this.withLifecycle(pooled, lifecycle), source: 'pool', pooled: true };
    }
    let source: CreateSource = 'start';
    const record = await this.slots.run('create', async () => {
      // While this create waited for a slot, a refill may have put a sandbox in the pool.
      const late = own
        ? undefined
        : await this.pool.claim(name, envs, metadata, timeoutMs, false, owner);
      if (late) {
        source = 'pool';
        await this.provider.setExpiry?.(late.handle, late.expiresAt).catch(() => undefined);
        return this.withLifecycle(late, lifecycle);
      }
      return (
        await this.start(await this.templates.get(name), 'running', envs, metadata, timeoutMs, {
          ...(owner ? { owner } : {}),
          ...(network ? { network } : {}),
          lifecycle,
          volumes,
          ...(mounted ? { workspace: mounted } : {}),
        })
      ).record;
    });
    return { record, source, pooled: !own && this.pool.max > 0 };
  }

  /** Why the registry refused a new sandbox's row: a volume removed meanwhile, or the limit. */
  private async notWritten(record: SandboxRecord, owner?: KeyOwner): Promise<SandboxError> {
    if (record.volumeMounts.length > 0 && this.volumes) {
      if (!(await this.volumes.allExist(record.volumeMounts))) {
        return new VolumeNotFoundError(
          `a volume of sandbox ${record.id} (${record.volumeMounts.map((m) => m.name).join(', ')}) was removed while it started; nothing was made`,
        );
      }
    }
    return limitExceeded(owner as KeyOwner);
  }

  /** A create's `volumeMounts`, checked (none: empty); refused where there are no volumes. */
  private volumeMounts(
    value: unknown,
    owner: KeyOwner | undefined,
    template: BuiltTemplate,
  ): Promise<SandboxVolumes> {
    if (value === undefined || value === null || (Array.isArray(value) && value.length === 0)) {
      return Promise.resolve({ records: [], specs: [] });
    }
    if (!this.volumes) {
      throw new InvalidArgumentError(
        `volumeMounts: the ${this.provider.name} provider has no volumes`,
      );
    }
    return this.volumes.mounts(value, owner?.keyId ?? null, sandboxHome(template.spec.user));
  }

  /** What a create's timeout does (`autoPause`), refused where this provider cannot pause. */
  private lifecycleOf(request: CreateSandboxRequest): LifecycleRecord | null {
    const lifecycle = checkLifecycle(request, this.autoPauseMemory);
    if (lifecycle) this.pauseProblem(lifecycle.keepMemory, 'autoPause');
    return lifecycle;
  }

  /** A sandbox handed from the pool, with its create's `autoPause` recorded. */
  private async withLifecycle(
    record: SandboxRecord,
    lifecycle: LifecycleRecord | null,
  ): Promise<SandboxRecord> {
    if (!lifecycle) return record;
    await this.registry.setLifecycle(record.id, lifecycle);
    return { ...record, lifecycle };
  }

  /** Refuses a pause (`what`) this provider cannot do. */
  private pauseProblem(memory: boolean, what: string): void {
    // A provider that hibernates only as set up for it says why not (kubernetes' emptyDir homes).
    const why =
      this.provider.hibernate && this.provider.wake
        ? this.provider.hibernateUnavailable?.()
        : `the ${this.provider.name} provider has no hibernate`;
    if (memory ? this.provider.freeze : why === undefined) return;
    const other = memory ? why === undefined : this.provider.freeze;
    const unset =
      this.provider.hibernate && why
        ? memory
          ? `; nor can it hibernate (memory: false) here: ${why}`
          : `: ${why}`
        : '';
    throw new InvalidArgumentError(
      `the ${this.provider.name} provider cannot ${memory ? 'pause a sandbox with its memory (freeze)' : 'hibernate a sandbox (pause with memory: false)'}, so ${what} is refused${other ? `; it can ${memory ? 'hibernate (memory: false)' : 'freeze (memory: true)'}` : ''}${unset}`,
    );
  }

  /**
   * A template's network on this provider: a template that names none gets `internet`, or —
   * where this provider cannot enforce egress — `none` (denied rather than allowed; the isolation
   * report says why). One that names `internet` is refused there by the provider.
   */
  private templateNetwork(template: BuiltTemplate): {
    network: SandboxSpec['network'];
    egress?: EgressPolicy;
  } {
    const { network, egress, networkDefault } = template.spec;
    if (network === 'internet' && networkDefault) {
      const unavailable = this.provider.internetUnavailable
        ? this.provider.internetUnavailable()
        : `the ${this.provider.name} provider has no internet network`;
      if (unavailable !== undefined) return { network: 'none' };
    }
    return { network, ...(egress ? { egress } : {}) };
  }

  /**
   * A pooled sandbox of a template with ports (and shell, which `server.start()` needs as envd's
   * `/exec` does) gets its command server's process started, waiting for the caller's
   * `server.start()`: the warm pool asks once the sandbox has waited unclaimed for a moment.
   */
  private async prestartServer(record: SandboxRecord): Promise<void> {
    const { capabilities } = record;
    if (!this.prestartServers || !capabilities.includes('ports') || !capabilities.includes('shell'))
      return;
    await prestartServer(record.handle, this.controlTokenOf(record.id));
  }

  /** Why this daemon's sandboxes cannot have root inside (`allow_root`), or undefined. */
  rootUnavailable(): string | undefined {
    return rootUnavailableOn(this.provider);
  }

  /** Starts a sandbox and records it; never leaves one running without a registry row. */
  private async start(
    template: BuiltTemplate,
    state: 'running' | 'pooled',
    envs: Record<string, string>,
    metadata: Record<string, string>,
    timeoutMs: number,
    options: {
      owner?: KeyOwner;
      network?: { network: SandboxSpec['network']; egress?: EgressPolicy };
      lifecycle?: LifecycleRecord | null;
      volumes?: SandboxVolumes;
      workspace?: SandboxSpec['workspace'] | UploadedRequest;
    } = {},
  ): Promise<{ record: SandboxRecord }> {
    const { owner, workspace: asked } = options;
    // An uploaded folder becomes a base of its own (docs/workspaces.md, "From a remote client"),
    // a snapshot's kept one a new base with its changes; pinned until this sandbox's row names it.
    if (!asked || !('upload' in asked)) {
      return this.startOnce(template, state, envs, metadata, timeoutMs, {
        ...options,
        workspace: asked,
      });
    }
    const from = asked.kept
      ? await this.bases.fromCopy(asked.kept.base)
      : this.bases.take(this.uploads, asked.upload, owner?.keyId);
    try {
      const { kept, upload: _upload, ...rest } = asked;
      const workspace = {
        ...rest,
        from,
        ...(kept ? { since: kept.since, layer: kept.layer } : {}),
      };
      return await this.startOnce(template, state, envs, metadata, timeoutMs, {
        ...options,
        workspace,
      });
    } finally {
      await this.bases.unpin(from);
    }
  }

  private async startOnce(
    template: BuiltTemplate,
    state: 'running' | 'pooled',
    envs: Record<string, string>,
    metadata: Record<string, string>,
    timeoutMs: number,
    options: {
      owner?: KeyOwner;
      network?: { network: SandboxSpec['network']; egress?: EgressPolicy };
      lifecycle?: LifecycleRecord | null;
      volumes?: SandboxVolumes;
      workspace?: SandboxSpec['workspace'];
    } = {},
  ): Promise<{ record: SandboxRecord }> {
    const { owner, network, lifecycle = null, volumes, workspace } = options;
    const id = newSandboxId();
    const accessToken = this.tokenOf(id);
    const dir = join(this.sandboxesDir, id);
    const began = performance.now();
    const kept: KeptSpec = {
      id,
      capabilities: template.spec.capabilities,
      template: template.spec.name,
      dir,
      ...(template.homeDir ? { baseHome: template.homeDir } : {}),
      env: { ...template.spec.env, ...envs },
      workdir: template.spec.workdir,
      resources: template.spec.resources,
      ...(network ?? this.templateNetwork(template)),
      ...(template.image ? { image: template.image } : {}),
      user: template.spec.user,
      ...(template.spec.allowRoot ? { allowRoot: true } : {}),
      timeoutMs,
      ...(template.spec.kubernetes ? { kubernetes: template.spec.kubernetes } : {}),
      ...(volumes && volumes.specs.length > 0 ? { volumeMounts: volumes.specs } : {}),
      ...(workspace ? { workspace } : {}),
    };
    // A user's sandbox that fails to start leaves an event (a pool's spare is nobody's yet).
    const failed = async (error: unknown) => {
      if (state !== 'running') return;
      const event = eventFor(
        { id, owner: owner?.keyId ?? null, template: template.spec.name },
        { type: 'sandbox.lifecycle.failed', data: { error: (error as Error).message } },
      );
      await this.registry.appendEvent(event).catch(() => undefined);
    };
    const handle = await this.provider
      .create({ ...kept, accessToken, controlToken: this.controlTokenOf(id) })
      .catch(async (error) => {
        // A sandbox that did not start leaves nothing: its folder holds its disk and log.
        rmSync(dir, { recursive: true, force: true });
        await failed(error);
        throw error;
      });
    const needed = template.spec.runtime?.node;
    if (needed !== undefined) {
      // The Node it really runs, whatever changed since the build (the daemon's, the host's).
      await verifySandboxNode(
        template.spec.name,
        needed,
        this.provider,
        template.image !== undefined,
        handle,
        this.controlTokenOf(id),
      ).catch(async (error) => {
        await this.provider.kill(handle);
        rmSync(dir, { recursive: true, force: true });
        await failed(error);
        throw error;
      });
    }
    const startCmd = template.spec.start;
    if (startCmd) {
      await startTemplateCommand(
        handle,
        this.controlTokenOf(id),
        startCmd,
        this.startReadyTimeoutMs,
      ).catch(async (error) => {
        await this.provider.kill(handle);
        rmSync(dir, { recursive: true, force: true });
        await failed(error);
        throw error;
      });
    }
    this.pool.observeStart(template.spec.name, performance.now() - began);
    // What a wake after a hibernate starts it as (a provider that can hibernate only).
    if (this.provider.wake) {
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, SPEC_FILE), JSON.stringify(kept), { mode: 0o600 });
    }
    // A pooled sandbox waits for its caller: its exec path is warmed now, off every create's path
    // (twice: V8 compiles a function better on its second run; a third changed nothing measured).
    if (state === 'pooled') {
      const token = this.controlTokenOf(id);
      if (await warmSandbox(handle, token)) await warmSandbox(handle, token);
    }
    const now = Date.now();
    const record: SandboxRecord = {
      id,
      template: template.spec.name,
      state,
      metadata,
      createdAt: now,
      expiresAt: now + timeoutMs,
      endedAt: null,
      endReason: null,
      tokenHash: hashToken(accessToken),
      handle,
      capabilities: template.spec.capabilities,
      owner: owner?.keyId ?? null,
      paused: null,
      lifecycle,
      volumeMounts: volumes?.records ?? [],
    };
    let written: boolean;
    try {
      // A pool's spare is nobody's sandbox yet: its `created` is written when it is claimed.
      written = await this.registry.insertSandbox(
        record,
        owner?.maxRunning,
        state === 'running'
          ? {
              type: 'sandbox.lifecycle.created',
              at: now,
              data: { source: 'start', metadata, expiresAt: record.expiresAt },
            }
          : undefined,
      );
    } catch (error) {
      // No row (the database does not answer): no sandbox either.
      await this.provider.kill(handle);
      rmSync(dir, { recursive: true, force: true });
      throw error;
    }
    if (!written) {
      // Another create of the same key took the last place while this one was starting, or a
      // volume it mounts was removed meanwhile.
      await this.provider.kill(handle);
      rmSync(dir, { recursive: true, force: true });
      throw await this.notWritten(record, owner);
    }
    return { record };
  }

  /**
   * Brings the warm pool of a template to its size now (see WarmPool) and resolves once the
   * refills that takes are done.
   */
  refill(template: string): Promise<void> {
    return this.pool.refill(template);
  }

  /**
   * Kills the pooled sandboxes of a template (all templates when none is named): after a rebuild
   * they would start from the old home, and a stopping daemon leaves none behind.
   */
  drainPool(template?: string): Promise<void> {
    return this.pool.drain(template);
  }

  /** The number of sandboxes the warm pool of a template aims at now (0: not used, or no pool). */
  poolSize(template: string): number {
    return this.pool.size(template);
  }

  /** Stops refilling and empties the warm pool (the daemon is stopping). */
  close(): Promise<void> {
    return this.pool.close();
  }

  /** The registry's row of a sandbox as it is, or undefined: nothing is checked or changed. */
  find(id: string): Promise<SandboxRecord | undefined> {
    return this.registry.getSandbox(id);
  }

  /** A sandbox in any state; one recorded as running whose processes are gone is marked dead. */
  async get(id: string): Promise<SandboxRecord> {
    const record = await this.registry.getSandbox(id);
    if (!record) throw new SandboxNotFoundError(`sandbox ${id} does not exist`);
    if (
      record.state === 'running' &&
      !this.ending.has(id) &&
      !this.provider.isAlive(record.handle)
    ) {
      await this.markDead(record);
      return (await this.registry.getSandbox(id)) ?? record;
    }
    return record;
  }

  /**
   * Records why a sandbox whose processes ended by themselves is gone (`oom` when the kernel's
   * OOM killer ended it, else `exited`) and releases what it held: its cgroups, its uid, its
   * folder. Resolves once that is done.
   */
  async markDead(record: SandboxRecord): Promise<void> {
    const running = this.ending.get(record.id);
    if (running) return running;
    const cause = this.provider.endCause(record.handle);
    const won =
      record.state === 'pooled'
        ? await this.registry.deleteSandbox(record.id, 'pooled')
        : await this.registry.endSandbox(record.id, 'dead', cause, {
            event: { type: 'sandbox.lifecycle.killed', data: killedData('dead', cause) },
          });
    // Another caller (this daemon's or another's) ended it first and releases it.
    if (!won) return;
    if (record.state !== 'pooled') this.events?.ended('dead');
    this.onEnded(record.id);
    return this.release(record);
  }

  /** Kills what is left of a sandbox and removes its folder; once per sandbox at a time. */
  private release(record: SandboxRecord): Promise<void> {
    let ending = this.ending.get(record.id);
    if (!ending) {
      ending = (async () => {
        await this.provider.kill(record.handle);
        // In the thread pool: unlinking a disk image took the event loop 10-35 ms per kill.
        await rm(join(this.sandboxesDir, record.id), { recursive: true, force: true });
        // An uploaded workspace's base goes with the last sandbox that names it (else at the
        // daemon's next start, which removes the bases no row names).
        await this.bases
          .dropIfUnused(record.handle.workspace?.from)
          .catch((error) =>
            this.log.failed(`removing sandbox ${record.id}'s workspace base`, error),
          );
      })().finally(() => this.ending.delete(record.id));
      this.ending.set(record.id, ending);
    }
    return ending;
  }

  /** A running sandbox, or SandboxNotFoundError saying why it is not running. */
  async running(id: string): Promise<SandboxRecord> {
    const record = await this.get(id);
    if (record.state === 'paused') throw pausedError(record);
    if (record.state !== 'running') {
      throw new SandboxNotFoundError(
        `sandbox ${id} is not running (${record.state}: ${record.endReason})`,
      );
    }
    if (!this.provider.isAlive(record.handle)) {
      await this.markDead(record);
      const ended = await this.registry.getSandbox(id);
      throw new SandboxNotFoundError(`sandbox ${id} is not running (dead: ${ended?.endReason})`);
    }
    return record;
  }

  /**
   * Runs `work` on a running sandbox's record with the sandbox frozen (after a pause or resume
   * under way, and before the next): nothing in it changes, or swaps a folder for a link, while
   * the daemon reads its workspace. Thawed after, whatever happened.
   */
  private frozenWorkspace<T>(id: string, work: (record: SandboxRecord) => Promise<T>): Promise<T> {
    return this.serial(id, async () => {
      const record = await this.running(id);
      if (!record.handle.workspace || !this.provider.freeze || !this.provider.thaw) {
        return work(record);
      }
      await this.provider.freeze(record.handle);
      try {
        return await work(record);
      } finally {
        await this.provider.thaw(record.handle);
      }
    });
  }

  /** Where a running sandbox's workspace is, whether a client uploaded it, and since when it counts. */
  async workspaceInfo(id: string): Promise<{ path: string; uploaded: boolean; since: number }> {
    const record = await this.running(id);
    const workspace = record.handle.workspace;
    if (!workspace) {
      throw new InvalidArgumentError(
        `sandbox ${id} has no workspace: create it with workspace: { from, path? } or { upload, path? }`,
      );
    }
    const uploaded = uploadedWorkspace(workspace.from);
    return {
      path: workspace.path,
      uploaded: uploaded !== undefined,
      since: uploaded ? (uploaded.since ?? uploaded.uploadedAt) : workspaceSince(record),
    };
  }

  /**
   * Copies a running sandbox's workspace changes (its upper layer) to `to`, the sandbox frozen
   * meanwhile, for a snapshot (snapshot-workspace.ts): what the snapshot keeps of it.
   */
  saveWorkspace(id: string, to: string): Promise<SnapshotWorkspace> {
    return this.frozenWorkspace(id, async (record) => {
      const { workspace } = record.handle;
      const copy = this.provider.copyWorkspaceLayer?.bind(this.provider);
      if (!workspace || !copy) {
        throw new InvalidArgumentError(
          `sandbox ${id}'s workspace cannot be kept in a snapshot on the ${this.provider.name} provider (the local provider on a root daemon can): take its changes first (GET /v1/sandboxes/${id}/workspace/diff)`,
        );
      }
      await copy(record.handle, to);
      // An uploaded one: the snapshot keeps a copy of its base too (it outlives the upload).
      const uploaded = await keepUploadedBase(workspace.from, to);
      return {
        ...(uploaded ? { uploaded } : {}),
        from: uploaded ? `the upload ${uploaded.uploadId}` : workspace.from,
        path: workspace.path,
        since: workspaceSince(record, await this.keptSpec(record)),
        // Whose the layer's files are: the sandbox's own uid, or (a rootless daemon's, a
        // container's, which have none of their own) the owner of the layer's root.
        uid: record.handle.uid ?? statSync(workspace.upper).uid,
      };
    });
  }

  /** What changed in a running sandbox's workspace (docs/workspaces.md), read frozen. */
  workspaceChanges(id: string): Promise<WorkspaceChanges> {
    return this.frozenWorkspace(id, (record) => sandboxWorkspaceChanges(id, record.handle));
  }

  /** The git patch of a running sandbox's workspace changes, read frozen. */
  workspaceDiff(id: string): Promise<WorkspaceDiff> {
    return this.frozenWorkspace(id, (record) => sandboxWorkspaceDiff(id, record.handle));
  }

  /**
   * Applies a running sandbox's workspace changes to its host folder (`{ paths?, dryRun?,
   * force? }`), the sandbox frozen meanwhile; a host edit since the workspace was mounted (or
   * the sandbox created, if earlier) is a conflict.
   */
  workspaceApply(id: string, body: unknown): Promise<ApplyResult> {
    return this.frozenWorkspace(id, (record) =>
      sandboxWorkspaceApply(id, record.handle, workspaceSince(record), body),
    );
  }

  list(filter: SandboxFilter): Promise<SandboxRecord[]> {
    return this.registry.listSandboxes(filter);
  }

  /**
   * Kills a sandbox; resolves once its processes are gone and its folder removed. On a sandbox
   * that already ended it finishes any cleanup left and resolves false.
   */
  async kill(
    id: string,
    state: 'killed' | 'expired' = 'killed',
    reason = 'killed',
  ): Promise<boolean> {
    // A pause or resume under way finishes first (its sandbox is then killed as it left it).
    await this.changing.get(id)?.catch(() => undefined);
    let record = await this.get(id);
    if (record.state === 'pooled') {
      // A spare nobody was handed: it leaves the pool and ends like any other.
      if (await this.registry.deleteSandbox(id, 'pooled')) {
        this.onEnded(id);
        await this.release(record);
        return true;
      }
      // A create claimed it meanwhile: it is that caller's running sandbox now.
      record = await this.get(id);
    }
    if (record.state !== 'running' && record.state !== 'paused') {
      await this.release(record);
      return false;
    }
    const ending = this.ending.get(id);
    if (ending) {
      await ending;
      return (await this.registry.getSandbox(id))?.state === state;
    }
    // Recorded first: a reaper pass that sees its processes gone must not call it dead. The
    // update is conditional: of a kill and an expiry racing (here or on another daemon sharing
    // the registry) one ends it, with its reason; the other answers false and leaves the
    // releasing to the winner.
    if (
      !(await this.registry.endSandbox(id, state, reason, {
        event: { type: 'sandbox.lifecycle.killed', data: killedData(state, reason) },
      }))
    ) {
      return false;
    }
    this.events?.ended(state);
    this.onEnded(id);
    await this.release(record);
    return true;
  }

  /**
   * A running internet sandbox's new egress policy: new connections and DNS questions follow it
   * at once (open ones go on). Kept in the registry with the sandbox's handle.
   */
  async setNetwork(id: string, body: unknown): Promise<SandboxRecord> {
    const record = await this.running(id);
    const policy = checkNetworkPolicy(body, 'network');
    if (!policy) throw new InvalidArgumentError('the body must be { allowOut?, denyOut? }');
    if (!egressPolicyOf(record.handle) || !this.provider.setNetwork) {
      throw new InvalidArgumentError(
        `sandbox ${id} is not on the internet network, so it has no egress policy to change; create it with a network policy (Sandbox.create({ network })) or from a template with network: internet`,
      );
    }
    const handle = await this.provider.setNetwork(record.handle, policy);
    const network = egressPolicyOf(handle);
    const event = {
      type: 'sandbox.lifecycle.updated' as const,
      data: { change: 'network', network: network ? publicPolicy(network) : null },
    };
    if (!(await this.registry.setHandle(id, handle, event))) {
      throw new SandboxNotFoundError(`sandbox ${id} ended while its network changed`);
    }
    return this.get(id);
  }

  /** An internet sandbox's policy and what egress allowed and refused for it. */
  async networkOf(id: string): Promise<PublicPolicy & EgressCounters> {
    const record = await this.running(id);
    const policy = egressPolicyOf(record.handle);
    if (!policy) {
      throw new InvalidArgumentError(
        `sandbox ${id} is not on the internet network: it has no egress policy or counters`,
      );
    }
    if (!this.provider.networkStats) {
      throw new InvalidArgumentError(
        `sandbox ${id}'s egress is enforced by the ${this.provider.name} provider, which counts no connections (a Kubernetes NetworkPolicy has no counters); its policy is in its info (abx info ${id}, GET /v1/sandboxes/${id})`,
      );
    }
    return { ...publicPolicy(policy), ...(await this.provider.networkStats(record.handle)) };
  }

  async setTimeout(id: string, timeoutMs: unknown): Promise<SandboxRecord> {
    const record = await this.running(id);
    const expiresAt = Date.now() + checkTimeout(timeoutMs);
    const event = {
      type: 'sandbox.lifecycle.updated' as const,
      data: { change: 'timeout', expiresAt },
    };
    if (!(await this.registry.setExpiry(id, expiresAt, event))) {
      const ended = await this.registry.getSandbox(id);
      throw new SandboxNotFoundError(
        `sandbox ${id} is not running (${ended?.state}: ${ended?.endReason})`,
      );
    }
    // A provider that ends sandboxes itself (kubernetes' Sandbox shutdownTime) follows the expiry.
    void this.provider.setExpiry?.(record.handle, expiresAt).catch(() => undefined);
    return this.get(id);
  }

  /** Runs one change of a sandbox (a pause, a resume) after those under way on it. */
  private serial<T>(id: string, work: () => Promise<T>): Promise<T> {
    const before = this.changing.get(id) ?? Promise.resolve();
    const next = before.catch(() => undefined).then(work);
    this.changing.set(id, next);
    const clear = () => {
      if (this.changing.get(id) === next) this.changing.delete(id);
    };
    next.then(clear, clear);
    return next;
  }

  /**
   * Pauses a running sandbox: `memory` (default true) freezes its processes where they are, their
   * memory kept; `memory: false` hibernates it: its processes end, its disk (home, /tmp, an
   * image's overlay) and environment are kept for `resume`. Recorded first (`paused`, removed
   * after {@link pausedTimeoutMs}), then done; a failure puts it back running and says why. A
   * paused sandbox counts against no key's limit of running sandboxes.
   */
  pause(
    id: string,
    options: { memory?: unknown } = {},
    /** The reaper's pause of a sandbox whose time was up then (a lifetime extended since wins). */
    expiredBy?: number,
  ): Promise<SandboxRecord> {
    const { memory = true } = options;
    if (typeof memory !== 'boolean') {
      throw new InvalidArgumentError(
        `memory must be true (freeze, memory kept) or false (hibernate, only the disk kept), not ${JSON.stringify(memory)}`,
      );
    }
    this.pauseProblem(memory, 'the pause');
    return this.serial(id, async () => {
      const record = await this.get(id);
      if (record.state === 'paused') throw pausedError(record, 'is paused already');
      if (expiredBy !== undefined && record.expiresAt > expiredBy) return record;
      const { handle } = await this.running(id);
      // Read while it runs: what a hibernated sandbox wakes with, and what a frozen one's forks
      // start with (a frozen envd cannot answer; a pooled sandbox got its create's envs late).
      const spec = memory
        ? this.provider.fork && (await this.hibernateSpec(record).catch(() => undefined))
        : await this.hibernateSpec(record);
      const at = Date.now();
      const paused = {
        type: 'sandbox.lifecycle.paused' as const,
        at,
        data: {
          kind: memory ? 'memory' : 'disk',
          reason: expiredBy === undefined ? 'api' : 'timeout',
          expiresAt: at + this.pausedTimeoutMs,
        },
      };
      if (
        !(await this.registry.pauseSandbox(id, { memory, at }, at + this.pausedTimeoutMs, paused))
      ) {
        return this.running(id);
      }
      this.onChanged(id);
      try {
        if (memory) await this.provider.freeze?.(handle);
        else await this.provider.hibernate?.(handle, spec as SandboxSpec);
      } catch (error) {
        // It runs on as it was (what a failed hibernate ended, the reaper finds dead).
        await this.provider.thaw?.(handle).catch(() => undefined);
        await this.registry.resumeSandbox(id, handle, record.expiresAt, undefined, {
          type: 'sandbox.lifecycle.resumed',
          data: {
            kind: memory ? 'memory' : 'disk',
            reason: 'pause failed',
            expiresAt: record.expiresAt,
          },
        });
        this.onChanged(id);
        throw new SandboxError(
          `sandbox ${id} could not be ${memory ? 'frozen' : 'hibernated'}, and runs on: ${(error as Error).message}`,
          { cause: error },
        );
      }
      this.events?.paused(memory ? 'freeze' : 'hibernate');
      return this.get(id);
    });
  }

  /**
   * Runs a paused sandbox again (a running one is answered as it is, `resumed: false`): a frozen
   * one where its processes were; a hibernated one started anew on its kept disk and environment.
   * It runs `timeoutMs` from now (default: its template's timeout). `owner`: the key asking; its
   * limit of running sandboxes applies when the sandbox is its own.
   */
  resume(
    id: string,
    options: { timeoutMs?: unknown } = {},
    owner?: KeyOwner,
  ): Promise<{ record: SandboxRecord; resumed: boolean }> {
    const asked = options.timeoutMs === undefined ? undefined : checkTimeout(options.timeoutMs);
    return this.serial(id, async () => {
      const record = await this.get(id);
      if (record.state === 'running') {
        if (!this.provider.isAlive(record.handle)) await this.running(id);
        return { record, resumed: false };
      }
      if (record.state !== 'paused' || !record.paused) await this.running(id);
      const timeoutMs =
        asked ??
        (await this.templates.get(record.template).then(
          (template) => template.spec.timeoutMs,
          () => DEFAULT_RESUME_TIMEOUT_MS,
        ));
      const limit = owner && owner.keyId === record.owner ? owner.maxRunning : null;
      if (limit !== null) {
        const running = await this.registry.listSandboxes({
          owner: owner?.keyId,
          state: 'running',
        });
        if (running.length >= limit) throw limitExceeded(owner as KeyOwner);
      }
      const refused = async (): Promise<never> => {
        const now = await this.registry.getSandbox(id);
        if (now?.state === 'paused') throw limitExceeded(owner as KeyOwner);
        return this.running(id) as Promise<never>;
      };
      if (record.paused?.memory) {
        const expiresAt = Date.now() + timeoutMs;
        const resumed = {
          type: 'sandbox.lifecycle.resumed' as const,
          data: { kind: 'memory', expiresAt },
        };
        if (!(await this.registry.resumeSandbox(id, record.handle, expiresAt, limit, resumed))) {
          await refused();
        }
        await this.provider.thaw?.(record.handle);
        this.onChanged(id);
        this.events?.resumed('freeze');
        return { record: await this.running(id), resumed: true };
      }
      const spec = await this.keptSpec(record);
      if (!this.provider.wake) this.pauseProblem(false, 'the resume');
      const handle = await (this.provider.wake as NonNullable<SandboxProvider['wake']>)(
        record.handle,
        spec,
      );
      try {
        // What envd had at the hibernate (a pooled sandbox's create envs, setEnv's) comes back.
        await this.setEnv(handle, this.controlTokenOf(id), spec.env);
        const expiresAt = Date.now() + timeoutMs;
        const resumed = {
          type: 'sandbox.lifecycle.resumed' as const,
          data: { kind: 'disk', expiresAt },
        };
        if (!(await this.registry.resumeSandbox(id, handle, expiresAt, limit, resumed))) {
          await refused();
        }
        // A provider that ends sandboxes itself (a Sandbox's shutdownTime) follows the expiry.
        await this.provider.setExpiry?.(handle, expiresAt).catch(() => undefined);
      } catch (error) {
        // Hibernated again, as it was before this resume.
        await this.provider.hibernate?.(handle, spec).catch(() => undefined);
        throw error;
      }
      this.onChanged(id);
      this.events?.resumed('hibernate');
      return { record: await this.get(id), resumed: true };
    });
  }

  /**
   * Forks a running or paused sandbox: `count` (1-10, default 1) new running sandboxes, each on a
   * copy of its disk (home, /tmp, an image's overlay; never its processes), with an id, tokens
   * and (root daemon) a uid of its own, its template, resources, network policy and environment
   * (what envd has now; a frozen source's envd cannot answer: what it had when it was paused), its
   * metadata with `metadata` over it, and `timeoutMs` (default: its template's). The forks are
   * `owner`'s and count against its limit. All start or none is left.
   */
  async fork(
    id: string,
    options: { count?: unknown; timeoutMs?: unknown; metadata?: unknown } = {},
    owner?: KeyOwner,
  ): Promise<{ record: SandboxRecord; accessToken: string }[]> {
    const forks = await this.forkOnce(id, options, owner);
    await this.refuseIfRevoked(
      owner,
      forks.map((f) => f.record.id),
    );
    return forks;
  }

  private forkOnce(
    id: string,
    options: { count?: unknown; timeoutMs?: unknown; metadata?: unknown },
    owner?: KeyOwner,
  ): Promise<{ record: SandboxRecord; accessToken: string }[]> {
    const count = checkForkCount(options.count);
    const asked = options.timeoutMs === undefined ? undefined : checkTimeout(options.timeoutMs);
    const extra = checkStringMap('metadata', options.metadata);
    const fork = this.provider.fork?.bind(this.provider);
    if (!fork) {
      throw new InvalidArgumentError(
        `the ${this.provider.name} provider cannot fork sandboxes (the local and docker providers can)`,
      );
    }
    return this.serial(id, async () => {
      const source = await this.get(id);
      if (source.state !== 'paused') await this.running(id);
      const paused = source.paused ? (source.paused.memory ? 'frozen' : 'hibernated') : undefined;
      if (owner && owner.maxRunning !== null) {
        const running = await this.registry.listSandboxes({ owner: owner.keyId, state: 'running' });
        if (running.length + count > owner.maxRunning) throw limitExceeded(owner);
      }
      let sourceSpec: SandboxSpec;
      try {
        sourceSpec = await this.keptSpec(source);
      } catch (error) {
        throw new SandboxError(
          `sandbox ${id} cannot be forked: ${(error as Error).message.replace(/^.*?: /, '')}`,
          { cause: error },
        );
      }
      // A running source's environment as envd has it now (a hibernated one's was kept so).
      const env = paused
        ? sourceSpec.env
        : Object.fromEntries(
            Object.entries(await sandboxEnv(source.handle, this.controlTokenOf(id))).filter(
              ([name]) => !FRESH_ENV.test(name),
            ),
          );
      const egress = egressPolicyOf(source.handle) ?? sourceSpec.egress;
      const timeoutMs =
        asked ??
        (await this.templates.get(source.template).then(
          (template) => template.spec.timeoutMs,
          () => DEFAULT_RESUME_TIMEOUT_MS,
        ));
      const metadata = { ...source.metadata, ...extra };
      // A fork's workspace: its own copy of the source's upper layer (the provider copies it)
      // over the same host folder (or uploaded base, shared: pinned until the forks' rows name
      // it); a host edit since the source mounted it is still a conflict.
      let workspace: SandboxSpec['workspace'];
      if (sourceSpec.workspace) {
        const { layer: _layer, ...mounted } = sourceSpec.workspace;
        workspace = { ...mounted, since: workspaceSince(source, sourceSpec) };
      }
      const base = this.bases.idOf(workspace?.from) === undefined ? undefined : workspace?.from;
      if (base) this.bases.pin(base);
      const one = async (): Promise<{ record: SandboxRecord; accessToken: string }> => {
        const began = performance.now();
        const forkId = newSandboxId();
        const accessToken = this.tokenOf(forkId);
        const dir = join(this.sandboxesDir, forkId);
        const {
          accessToken: _access,
          controlToken: _control,
          baseHome: _home,
          ...inherited
        } = sourceSpec;
        const kept: KeptSpec = {
          ...inherited,
          id: forkId,
          dir,
          env,
          timeoutMs,
          ...(egress ? { egress } : {}),
          ...(workspace ? { workspace } : {}),
        };
        // A fork that does not start leaves a `failed` event under the id it would have had.
        const failed = async (error: unknown) => {
          const event = eventFor(
            { id: forkId, owner: owner?.keyId ?? null, template: source.template },
            {
              type: 'sandbox.lifecycle.failed',
              data: { error: (error as Error).message, forkedFrom: id },
            },
          );
          await this.registry.appendEvent(event).catch(() => undefined);
        };
        const handle = await this.slots
          .run('create', () =>
            fork(
              source.handle,
              sourceSpec,
              {
                ...kept,
                accessToken,
                controlToken: this.controlTokenOf(forkId),
              },
              paused,
            ),
          )
          .catch(async (error) => {
            await rm(dir, { recursive: true, force: true });
            await failed(error);
            throw error;
          });
        await writeFile(join(dir, SPEC_FILE), JSON.stringify(kept), { mode: 0o600 });
        const now = Date.now();
        const record: SandboxRecord = {
          ...source,
          id: forkId,
          state: 'running',
          metadata,
          createdAt: now,
          expiresAt: now + timeoutMs,
          endedAt: null,
          endReason: null,
          tokenHash: hashToken(accessToken),
          handle,
          owner: owner?.keyId ?? null,
          paused: null,
          lifecycle: null,
        };
        const created = {
          type: 'sandbox.lifecycle.created' as const,
          at: now,
          data: { source: 'fork', forkedFrom: id, metadata, expiresAt: record.expiresAt },
        };
        const written = await this.registry
          .insertSandbox(record, owner?.maxRunning, created)
          .catch(async (error) => {
            await this.provider.kill(handle);
            await rm(dir, { recursive: true, force: true });
            throw error;
          });
        if (!written) {
          await this.provider.kill(handle);
          await rm(dir, { recursive: true, force: true });
          throw await this.notWritten(record, owner);
        }
        this.events?.created(record.template, 'fork', (performance.now() - began) / 1000, false);
        return { record, accessToken };
      };
      const results = await Promise.allSettled(Array.from({ length: count }, one)).finally(
        () => base && this.bases.unpin(base),
      );
      const made = results.flatMap((result) =>
        result.status === 'fulfilled' ? [result.value] : [],
      );
      const failed = results.find((result) => result.status === 'rejected');
      if (failed) {
        // All or none: the forks that started end with the one that did not.
        await Promise.all(made.map(({ record }) => this.kill(record.id, 'killed', 'fork failed')));
        throw failed.reason;
      }
      return made;
    });
  }

  /** What a sandbox was started with, and its tokens: what it wakes as. */
  private async keptSpec(record: SandboxRecord): Promise<SandboxSpec> {
    let kept: KeptSpec;
    try {
      kept = JSON.parse(await readFile(join(this.sandboxesDir, record.id, SPEC_FILE), 'utf8'));
    } catch (error) {
      throw new SandboxError(
        `sandbox ${record.id} cannot wake: what it was started with (${join(this.sandboxesDir, record.id, SPEC_FILE)}) cannot be read: ${(error as Error).message}`,
        { cause: error },
      );
    }
    return {
      ...kept,
      accessToken: this.tokenOf(record.id),
      controlToken: this.controlTokenOf(record.id),
    };
  }

  /** The spec a hibernated sandbox wakes as: its own, with the environment envd has now. */
  private async hibernateSpec(record: SandboxRecord): Promise<SandboxSpec> {
    const spec = await this.keptSpec(record);
    const env = await sandboxEnv(record.handle, this.controlTokenOf(record.id));
    spec.env = Object.fromEntries(Object.entries(env).filter(([name]) => !FRESH_ENV.test(name)));
    const { accessToken: _access, controlToken: _control, ...kept } = spec;
    await writeFile(join(this.sandboxesDir, record.id, SPEC_FILE), JSON.stringify(kept), {
      mode: 0o600,
    });
    return spec;
  }

  /**
   * The reaper's end of a sandbox whose time was up at `now`: one conditional update claims it
   * (still running, still due: a lifetime extended since the pass read it wins), and only the
   * caller that claimed it kills it. Of several daemons' reapers, one wins each sandbox. One
   * created with `autoPause` is paused instead; a paused one is removed (its paused timeout).
   */
  private async expire(record: SandboxRecord, now: number): Promise<boolean> {
    if (this.ending.has(record.id) || this.changing.has(record.id)) return false;
    if (record.state === 'running' && record.lifecycle?.onTimeout === 'pause') {
      await this.pause(record.id, { memory: record.lifecycle.keepMemory }, now);
      return true;
    }
    const reason =
      record.state === 'paused'
        ? `paused since ${new Date(record.paused?.at ?? record.createdAt).toISOString()}, removed at its paused timeout`
        : `expired at ${new Date(record.expiresAt).toISOString()}`;
    const event = {
      type: 'sandbox.lifecycle.killed' as const,
      data: killedData('expired', reason),
    };
    if (
      !(await this.registry.endSandbox(record.id, 'expired', reason, { expiredBy: now, event }))
    ) {
      return false;
    }
    this.events?.ended('expired');
    this.onEnded(record.id);
    await this.release(record);
    return true;
  }

  /** What a {@link Reaper} watching these sandboxes needs. */
  reaperHost(): ReaperHost {
    return {
      registry: this.registry,
      isAlive: (handle) => this.provider.isAlive(handle),
      isEnding: (id) => this.ending.has(id),
      markDead: (record) => this.markDead(record),
      expire: (record, now) => this.expire(record, now),
      release: (record) => this.release(record),
      ...(this.sharesOrphans()
        ? {
            sweep: async () => {
              const orphans = await this.sweepOrphans();
              // The uploaded workspaces' bases that only the orphans named.
              await this.bases.sweep();
              return orphans;
            },
          }
        : {}),
    };
  }

  /**
   * Whether other daemons create sandboxes this one's sweep sees (a shared registry, a provider
   * whose sandboxes every replica sees): then only orphans older than any create are swept, and
   * the reaper sweeps while the daemon runs.
   */
  private sharesOrphans(): boolean {
    return this.registry.kind === 'postgres' && this.provider.orphanAgeMs !== undefined;
  }

  /**
   * Kills the sandboxes of this folder that have no running or pooled row (a daemon died between
   * starting one and recording it), and removes their folders. With other daemons on the
   * registry, those younger than the provider's `orphanAgeMs` are left: they may be creates
   * under way there.
   */
  private async sweepOrphans(known: ReadonlySet<string> = new Set()): Promise<string[]> {
    // Rows are read before the provider lists its sandboxes: a create that records its row in
    // between made its sandbox less than `orphanAgeMs` ago, and is left alone.
    const startedBefore = this.sharesOrphans()
      ? Date.now() - (this.provider.orphanAgeMs as number)
      : undefined;
    const rows = new Set(known);
    for (const state of ['running', 'pooled', 'paused'] as const) {
      for (const record of await this.registry.listSandboxes({ state })) rows.add(record.id);
    }
    const orphans = await this.provider.sweepOrphans(this.sandboxesDir, rows, startedBefore);
    for (const id of orphans) rmSync(join(this.sandboxesDir, id), { recursive: true, force: true });
    return orphans;
  }

  /**
   * After a daemon (re)start: sandboxes whose processes still run are kept; rows of sandboxes
   * that died meanwhile are marked dead, and their folders removed.
   */
  async adopt(): Promise<{ adopted: string[]; dead: string[]; orphans: string[] }> {
    const adopted: string[] = [];
    const dead: string[] = [];
    // A previous daemon's spare sandboxes may come from an older template build: start afresh.
    // Not on a shared registry: the spares there are other live daemons' pools.
    if (this.registry.kind === 'sqlite') await this.drainPool();
    // Paused ones are left as their rows say, whatever a daemon that died mid-way left: a frozen
    // one frozen, a hibernated one without processes (and its disk kept).
    for (const record of await this.registry.listSandboxes({ state: 'paused' })) {
      adopted.push(record.id);
      const settle = record.paused?.memory
        ? this.provider.isAlive(record.handle)
          ? this.provider.freeze?.(record.handle)
          : this.markDead(record).then(() => dead.push(record.id))
        : this.keptSpec(record).then((spec) => this.provider.hibernate?.(record.handle, spec));
      await settle?.catch((error: Error) => {
        console.error(`abx daemon: paused sandbox ${record.id}: ${error.message}`);
      });
    }
    for (const record of await this.registry.listSandboxes({ state: 'running' })) {
      if (this.provider.isAlive(record.handle)) {
        adopted.push(record.id);
        // A running row's sandbox is frozen only while a daemon reads its workspace, forks or
        // snapshots it: one that died meanwhile left it so, and nothing else would thaw it. Not
        // where other daemons share the sandboxes (one may be reading it now).
        if (!this.sharesOrphans()) {
          await this.provider.thaw?.(record.handle).catch((error: Error) => {
            console.error(`abx daemon: sandbox ${record.id}: thawing it: ${error.message}`);
          });
        }
        // What the daemon served it (an internet sandbox's egress) is served again; a failure
        // leaves it without that (its rules deny rather than allow), said in the log.
        await this.provider.adopt?.(record.handle).catch((error: Error) => {
          console.error(`abx daemon: sandbox ${record.id}: ${error.message}`);
        });
      } else {
        // Releases what the dead sandbox still holds on the host (cgroups, uid, folder).
        await this.markDead(record);
        dead.push(record.id);
      }
    }
    // A sandbox without a running row must not run: kill what a crash left behind.
    const orphans = await this.sweepOrphans(new Set(adopted));
    // Uploaded workspaces' bases no row names any more (a daemon that died before removing one).
    await this.bases.sweep();
    return { adopted, dead, orphans };
  }
}

/**
 * The network a create asks for, when it differs from the template's: a `network` policy means
 * `internet` with it (replacing the template's lists); `allowInternetAccess: true` means
 * `internet`; `false` denies every address (what `allowOut` names still passes, as in E2B). A
 * template on the host's network takes neither.
 */
function sandboxNetwork(
  templateName: string,
  own: { network: SandboxSpec['network']; egress?: EgressPolicy },
  request: CreateSandboxRequest,
): { network: SandboxSpec['network']; egress?: EgressPolicy } | undefined {
  const policy = checkNetworkPolicy(request.network);
  const internet = request.allowInternetAccess;
  if (internet !== undefined && typeof internet !== 'boolean') {
    throw new InvalidArgumentError(
      `allowInternetAccess must be true or false, not ${JSON.stringify(internet)}`,
    );
  }
  if (!policy && internet === undefined) return undefined;
  if (own.network === 'host') {
    throw new InvalidArgumentError(
      `template ${templateName} gives its sandboxes the host's network, which takes no egress policy; leave out network and allowInternetAccess, or use a template whose network is none or internet`,
    );
  }
  if (internet === false && !policy && own.network === 'none') {
    return { network: 'none' };
  }
  const lists = policy ?? own.egress ?? { allowOut: [], denyOut: [] };
  return { network: 'internet', egress: internet === false ? withoutInternet(lists) : lists };
}
