import { rmSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { MAX_SANDBOX_TIMEOUT_MS } from '../../runtime/protocol/constants.js';
import { type EgressPolicy, withoutInternet } from '../egress/policy.js';
import type { EgressCounters } from '../egress/service.js';
import {
  errorResponse,
  InvalidArgumentError,
  LimitExceededError,
  SandboxNotFoundError,
} from '../errors.js';
import {
  egressPolicyOf,
  type SandboxHandle,
  type SandboxProvider,
  type SandboxSpec,
} from '../providers/provider.js';
import { BackgroundLog } from './background-log.js';
import { warmSandbox } from './envd-request.js';
import { hashToken, newSandboxId, type TokenKind } from './ids.js';
import type { CreateSource, SandboxEvents } from './prometheus.js';
import type { ReaperHost } from './reaper.js';
import type { Registry, SandboxFilter, SandboxOwner, SandboxRecord } from './registry.js';
import {
  type CreateSandboxRequest,
  checkEnvs,
  checkNetworkPolicy,
  checkStringMap,
  checkTimeout,
} from './sandbox-request.js';
import { StartSlots } from './start-slots.js';
import type { BuiltTemplate, TemplateService } from './template-service.js';
import { WarmPool, type WarmPoolOptions } from './warm-pool.js';

/** The API key a sandbox is created for: its id, its limit, and its name for messages. */
export interface KeyOwner extends SandboxOwner {
  name: string;
}

/** The refusal of a create over a key's limit of running sandboxes. */
function limitExceeded(owner: KeyOwner): LimitExceededError {
  return new LimitExceededError(
    `the API key '${owner.name}' (${owner.keyId}) has ${owner.maxRunning} sandboxes running, its limit (--max-running): kill one of them (abx list, abx kill ID) or ask an admin for a key with a higher limit`,
    { code: 'limit_exceeded' },
  );
}

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
  /** Told of each create and end (the daemon's Prometheus metrics); none: nothing is counted. */
  events: SandboxEvents | undefined;

  constructor(
    private readonly registry: Registry,
    private readonly provider: SandboxProvider,
    private readonly templates: TemplateService,
    private readonly sandboxesDir: string,
    /** A token of a sandbox id (derived, never stored): its users' or the control plane's. */
    private readonly tokens: (id: string, kind: TokenKind) => string,
    /** Adds variables to a running sandbox's environment (envd's `PUT /env`). */
    setEnv: (handle: SandboxHandle, token: string, env: Record<string, string>) => Promise<void>,
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
        log: (what, error) => this.log.failed(what, error),
        recovered: (what) => this.log.recovered(what),
      },
      options,
    );
  }

  private readonly pool: WarmPool;
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
  ): Promise<{ record: SandboxRecord; accessToken: string }> {
    const began = performance.now();
    try {
      const { record, source, pooled } = await this.createOnce(request, owner);
      this.events?.created(record.template, source, (performance.now() - began) / 1000, pooled);
      return { record, accessToken: this.tokenOf(record.id) };
    } catch (error) {
      // A refused request (4xx) is the caller's; only the daemon's own failures count.
      if (errorResponse(error).status >= 500) this.events?.createFailed(request.template ?? 'base');
      throw error;
    }
  }

  private async createOnce(
    request: CreateSandboxRequest,
    owner?: KeyOwner,
  ): Promise<{ record: SandboxRecord; source: CreateSource; pooled: boolean }> {
    const template = await this.templates.get(request.template ?? 'base');
    const timeoutMs =
      request.timeoutMs === undefined ? template.spec.timeoutMs : checkTimeout(request.timeoutMs);
    const envs = checkEnvs(request.envs);
    const metadata = checkStringMap('metadata', request.metadata);
    const network = sandboxNetwork(template.spec.name, this.templateNetwork(template), request);
    const name = template.spec.name;
    // Refused before a sandbox is started when the limit is plainly reached; the registry's
    // locked write below is what makes the limit hold under concurrent creates.
    if (owner && owner.maxRunning !== null) {
      const running = await this.registry.listSandboxes({ owner: owner.keyId, state: 'running' });
      if (running.length >= owner.maxRunning) throw limitExceeded(owner);
    }
    // The pool refills itself in the background: nothing of it runs on this create's path. Its
    // sandboxes have the template's network: one asked with another starts afresh.
    const pooled = network
      ? undefined
      : await this.pool.claim(name, envs, metadata, timeoutMs, true, owner);
    if (pooled) {
      // A provider that ends sandboxes itself (kubernetes' Sandbox shutdownTime) follows the expiry.
      await this.provider.setExpiry?.(pooled.handle, pooled.expiresAt).catch(() => undefined);
      return { record: pooled, source: 'pool', pooled: true };
    }
    let source: CreateSource = 'start';
    const record = await this.slots.run('create', async () => {
      // While this create waited for a slot, a refill may have put a sandbox in the pool.
      const late = network
        ? undefined
        : await this.pool.claim(name, envs, metadata, timeoutMs, false, owner);
      if (late) {
        source = 'pool';
        await this.provider.setExpiry?.(late.handle, late.expiresAt).catch(() => undefined);
        return late;
      }
      return (
        await this.start(
          await this.templates.get(name),
          'running',
          envs,
          metadata,
          timeoutMs,
          owner,
          network,
        )
      ).record;
    });
    return { record, source, pooled: !network && this.pool.max > 0 };
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

  /** Starts a sandbox and records it; never leaves one running without a registry row. */
  private async start(
    template: BuiltTemplate,
    state: 'running' | 'pooled',
    envs: Record<string, string>,
    metadata: Record<string, string>,
    timeoutMs: number,
    owner?: KeyOwner,
    network?: { network: SandboxSpec['network']; egress?: EgressPolicy },
  ): Promise<{ record: SandboxRecord }> {
    const id = newSandboxId();
    const accessToken = this.tokenOf(id);
    const dir = join(this.sandboxesDir, id);
    const began = performance.now();
    const handle = await this.provider
      .create({
        id,
        accessToken,
        controlToken: this.controlTokenOf(id),
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
        timeoutMs,
        ...(template.spec.kubernetes ? { kubernetes: template.spec.kubernetes } : {}),
      })
      .catch((error) => {
        // A sandbox that did not start leaves nothing: its folder holds its disk and log.
        rmSync(dir, { recursive: true, force: true });
        throw error;
      });
    this.pool.observeStart(template.spec.name, performance.now() - began);
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
    };
    let written: boolean;
    try {
      written = await this.registry.insertSandbox(record, owner?.maxRunning);
    } catch (error) {
      // No row (the database does not answer): no sandbox either.
      await this.provider.kill(handle);
      rmSync(dir, { recursive: true, force: true });
      throw error;
    }
    if (!written) {
      // Another create of the same key took the last place while this one was starting.
      await this.provider.kill(handle);
      rmSync(dir, { recursive: true, force: true });
      throw limitExceeded(owner as KeyOwner);
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
        : await this.registry.endSandbox(record.id, 'dead', cause);
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
      })().finally(() => this.ending.delete(record.id));
      this.ending.set(record.id, ending);
    }
    return ending;
  }

  /** A running sandbox, or SandboxNotFoundError saying why it is not running. */
  async running(id: string): Promise<SandboxRecord> {
    const record = await this.get(id);
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
    if (record.state !== 'running') {
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
    if (!(await this.registry.endSandbox(id, state, reason))) return false;
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
    if (!(await this.registry.setHandle(id, handle))) {
      throw new SandboxNotFoundError(`sandbox ${id} ended while its network changed`);
    }
    return this.get(id);
  }

  /** An internet sandbox's policy and what egress allowed and refused for it. */
  async networkOf(id: string): Promise<EgressPolicy & EgressCounters> {
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
    return { ...policy, ...(await this.provider.networkStats(record.handle)) };
  }

  async setTimeout(id: string, timeoutMs: unknown): Promise<SandboxRecord> {
    const record = await this.running(id);
    const expiresAt = Date.now() + checkTimeout(timeoutMs);
    if (!(await this.registry.setExpiry(id, expiresAt))) {
      const ended = await this.registry.getSandbox(id);
      throw new SandboxNotFoundError(
        `sandbox ${id} is not running (${ended?.state}: ${ended?.endReason})`,
      );
    }
    // A provider that ends sandboxes itself (kubernetes' Sandbox shutdownTime) follows the expiry.
    void this.provider.setExpiry?.(record.handle, expiresAt).catch(() => undefined);
    return this.get(id);
  }

  /**
   * The reaper's end of a sandbox whose time was up at `now`: one conditional update claims it
   * (still running, still due: a lifetime extended since the pass read it wins), and only the
   * caller that claimed it kills it. Of several daemons' reapers, one wins each sandbox.
   */
  private async expire(record: SandboxRecord, now: number): Promise<boolean> {
    if (this.ending.has(record.id)) return false;
    const reason = `expired at ${new Date(record.expiresAt).toISOString()}`;
    if (!(await this.registry.endSandbox(record.id, 'expired', reason, { expiredBy: now }))) {
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
      ...(this.sharesOrphans() ? { sweep: () => this.sweepOrphans() } : {}),
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
    for (const state of ['running', 'pooled'] as const) {
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
    for (const record of await this.registry.listSandboxes({ state: 'running' })) {
      if (this.provider.isAlive(record.handle)) {
        adopted.push(record.id);
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
