import { randomBytes } from 'node:crypto';
import { dirname } from 'node:path';
import {
  ApisApi,
  CoreV1Api,
  CustomObjectsApi,
  type Informer,
  type KubeConfig,
  makeInformer,
  type V1OwnerReference,
  type V1PersistentVolumeClaim,
  type V1Pod,
} from '@kubernetes/client-node';
import { ENVD_PORT } from '../../../runtime/protocol/constants.js';
import { DEFAULT_DISK_BYTES } from '../../commands/template-runtime.js';
import { egressOptionsFromEnv } from '../../egress/controller.js';
import { type EgressPolicy, parsePolicy } from '../../egress/policy.js';
import {
  InvalidArgumentError,
  SandboxError,
  SandboxStartError,
  UnavailableError,
} from '../../errors.js';
import { envdHealthy } from '../local/local-provider.js';
import {
  type EndCause,
  envdTokenFile,
  type IsolationReport,
  type SandboxHandle,
  type SandboxProvider,
  type SandboxSpec,
  type SandboxUsage,
} from '../provider.js';
import { tcpTarget } from '../sandbox-socket.js';
import {
  AGENT_SANDBOX_VERSION,
  type AgentSandbox,
  agentSandbox,
  type OperatingMode,
  SANDBOXES,
  shutdownTime,
} from './agent-sandbox.js';
import {
  bootstrapSecret,
  bootstrapSecretName,
  bootstrapTokens,
  type ClaimStatus,
  claimedEnv,
  claimProgress,
  podTemplateName,
  SANDBOX_CLAIMS,
  SANDBOX_TEMPLATES,
  SANDBOX_WARM_POOLS,
  sandboxClaim,
  sandboxTemplate,
  sandboxWarmPool,
  templatePod,
  tokensOf,
} from './agent-sandbox-claims.js';
import { AGENT_SANDBOX_EXTENSIONS_GROUP, AGENT_SANDBOX_GROUP } from './cluster-check.js';
import { envdGet, envdPut } from './envd-put.js';
import { copyHome } from './home-copy.js';
import {
  type KubeConfigOptions,
  kubeError,
  kubeMessage,
  loadKubeConfig,
  NetworkPolicies,
  serverOf,
  statusOf,
} from './kube-client.js';
import {
  domainsRefusal,
  egressNetworkPolicy,
  networkPolicyName,
  permittedRanges,
  unenforceableEntries,
} from './network-policy.js';
import { PodUsage } from './pod-metrics.js';
import {
  HOME_VOLUME,
  homeClaimName,
  MANAGED_BY,
  MANAGED_BY_LABEL,
  NETWORK_LABEL,
  podName,
  SANDBOX_CONTAINER,
  SANDBOX_ID_LABEL,
  SANDBOXES_LABEL,
  sandboxesHash,
  sandboxPod,
  secretName,
  TOKEN_KEY,
  tokenSecret,
} from './pod-spec.js';
import { eventSummary, oomKilled, type PodProgress, podProgress } from './pod-status.js';
import {
  type AccessMode,
  claimAdvice,
  claimSpec,
  claimState,
  homeClaimLabels,
  KubeVolumes,
} from './volume-claims.js';

/** The image of templates without one (a home is mounted for the user: the image has none). */
export const DEFAULT_BASE_IMAGE = 'debian:bookworm-slim';
/** The image holding the portable runtime at /opt/abx, for the init container (see docs). */
export const DEFAULT_RUNTIME_IMAGE = 'abx-runtime:latest';

export interface KubernetesProviderOptions extends KubeConfigOptions {
  /** The namespace sandboxes run in; default the context's namespace, else `default`. */
  namespace?: string;
  /** The init container's image: the portable runtime at /opt/abx. */
  runtimeImage?: string;
  /** The image of templates without one; default {@link DEFAULT_BASE_IMAGE}. */
  baseImage?: string;
  /** How long a pod has to become ready, from the call (pulls included); default 120 s. */
  startTimeoutMs?: number;
  /**
   * How old a labelled pod without a registry row must be before a daemon sharing the registry
   * deletes it as an orphan; default the start timeout + {@link ORPHAN_MARGIN_MS}.
   */
  orphanAgeMs?: number;
  imagePullPolicy?: 'Always' | 'IfNotPresent' | 'Never';
  /** Keep a watch of the provider's pods for `isAlive` (default true; false for one-off checks). */
  watch?: boolean;
  /**
   * Make sandboxes as agent-sandbox `Sandbox` objects (true), as plain pods (false), as Sandboxes
   * when the cluster serves agents.x-k8s.io/v1beta1 ('auto', the default), or as `SandboxClaim`s
   * on a `SandboxWarmPool` of a `SandboxTemplate` per template ('claims': the cluster pools).
   */
  agentSandbox?: boolean | 'auto' | 'claims';
  /** 'claims': the replicas of each template's SandboxWarmPool (default 1). */
  warmPoolReplicas?: number;
  /**
   * Always-denied ranges that `internet` sandboxes may reach all the same (CIDRs); default
   * ABX_EGRESS_PERMIT, as on the other providers (docs/network.md).
   */
  egressPermit?: string[];
  /**
   * Where a sandbox's home and /tmp live: `emptyDir` (the default: gone with the pod, no
   * hibernate) or `pvc`, a PersistentVolumeClaim of its own (ReadWriteOnce, the template's disk
   * size) that a hibernate keeps while the pod is gone. Not in claims mode.
   */
  home?: 'emptyDir' | 'pvc';
  /** The StorageClass of home claims; default the cluster's default class. */
  homeStorageClass?: string;
  /** The StorageClass of abx volumes' claims; default the cluster's default class. */
  volumeStorageClass?: string;
  /**
   * The access mode of abx volumes' claims: ReadWriteMany (the default: sandboxes on any node
   * share a volume; the class must give it) or ReadWriteOnce (only pods of one node can mount it
   * at once: sandboxes that share a volume must land on one node).
   */
  volumeAccessMode?: AccessMode;
  /** How long a volume's create watches its claim for a provisioning failure (default 10 s). */
  volumeSettleMs?: number;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** How long `kill` and cleanups wait for the API server to forget a pod. */
const GONE_MS = 30_000;
/** How soon a pod watch that ended with an error is started again. */
const REWATCH_MS = 1000;
/**
 * Past the start timeout, how long a create may still take to write its row (the registry's
 * connect and query timeouts, 5 s and 15 s, with room for clocks that disagree a little).
 */
export const ORPHAN_MARGIN_MS = 60_000;

/**
 * Sandboxes as pods, one each, through the cluster's API (`@kubernetes/client-node`): the pod of
 * {@link sandboxPod}, its token in a Secret owned by the pod. The handle names the pod (and its
 * uid, as `startTime`: a pod of the same name made later is another sandbox) and envd's address,
 * `tcp://podIP:49983`, which the gateway dials. Liveness is synchronous in the interface, so it
 * comes from a cache of the provider's pods kept by a list+watch (an informer).
 */
/** Why claims mode gives no internet network (the isolation report, and the default's fallback). */
const CLAIMS_NO_INTERNET =
  "internet network unavailable in claims mode: a warm pool's pods start before their sandbox, so no NetworkPolicy of its own can select them; such sandboxes do not start, and templates that name no network run offline";

export class KubernetesProvider implements SandboxProvider {
  readonly name = 'kubernetes';
  readonly namespace: string;
  readonly config: KubeConfig;
  readonly server: string;
  readonly orphanAgeMs: number;
  private readonly core: CoreV1Api;
  private readonly custom: CustomObjectsApi;
  private readonly networkPolicies: NetworkPolicies;
  private readonly permit: ReturnType<typeof permittedRanges>;
  private crds: Promise<boolean> | undefined;
  private informer: Informer<V1Pod> | undefined;
  private synced = false;
  private closed = false;
  /** Pods known by name from the watch (uid, phase, deletion under way, OOM). */
  private readonly pods = new Map<string, V1Pod>();
  /** Uids of pods this provider saw gone (or removed itself). */
  private readonly gone = new Set<string>();
  private readonly oom = new Set<string>();
  /** Waiters for changes of one pod, by name. */
  private readonly waiters = new Map<string, Set<() => void>>();
  private rewatch: NodeJS.Timeout | undefined;
  /** 'claims': each pod template's objects, made once (name → its bootstrap tokens). */
  private readonly templates = new Map<string, Promise<{ client: string; control: string }>>();
  /** abx volumes: a PersistentVolumeClaim each. */
  readonly volumes: KubeVolumes;
  /**
   * What a sandbox uses, from the resource metrics API (metrics.k8s.io); set by
   * {@link useMetricsApi} once the cluster is known to serve it, absent otherwise.
   */
  metrics?: (handle: SandboxHandle) => Promise<SandboxUsage>;
  private usage: PodUsage | undefined;
  /** Each pod's control token (by uid), read once from its Secret, for envd's statfs. */
  private readonly tokens = new Map<string, string>();

  constructor(private readonly options: KubernetesProviderOptions = {}) {
    this.config = loadKubeConfig(options);
    this.server = serverOf(this.config);
    const context = this.config.getContextObject(this.config.getCurrentContext());
    this.namespace = options.namespace ?? context?.namespace ?? 'default';
    this.orphanAgeMs =
      options.orphanAgeMs ?? (options.startTimeoutMs ?? 120_000) + ORPHAN_MARGIN_MS;
    this.core = this.config.makeApiClient(CoreV1Api);
    this.custom = this.config.makeApiClient(CustomObjectsApi);
    this.networkPolicies = new NetworkPolicies(this.config, this.namespace);
    this.permit = permittedRanges(options.egressPermit ?? egressOptionsFromEnv().permit ?? []);
    this.volumes = new KubeVolumes({
      core: this.core,
      namespace: this.namespace,
      server: this.server,
      accessMode: options.volumeAccessMode ?? 'ReadWriteMany',
      ...(options.volumeStorageClass ? { storageClass: options.volumeStorageClass } : {}),
      ...(options.volumeSettleMs !== undefined ? { settleMs: options.volumeSettleMs } : {}),
      unavailable: () =>
        options.agentSandbox === 'claims'
          ? "the kubernetes provider mounts no volumes in claims mode (--kube-agent-sandbox claims): a warm pool's pods are made before their sandbox, from a template every sandbox shares; use --kube-agent-sandbox true or false"
          : undefined,
      statfs: (claim) => this.claimStatfs(claim),
    });
    if (options.watch !== false) this.watchPods();
  }

  /** True when sandboxes' homes are claims of their own (`home: 'pvc'`, not in claims mode). */
  get homeOnClaim(): boolean {
    return this.options.home === 'pvc' && this.options.agentSandbox !== 'claims';
  }

  /**
   * Gives the provider its `metrics` from the resource metrics API (metrics.k8s.io, which
   * metrics-server serves): call once discovery found it (`checkCluster`'s `metricsApi`).
   */
  useMetricsApi(): void {
    const usage = new PodUsage(this.custom, this.namespace, this.server);
    this.usage = usage;
    this.metrics = async (handle) => {
      const name = handle.pod?.name;
      const pod = name ? this.pods.get(name) : undefined;
      if (!pod || pod.metadata?.uid !== handle.startTime) {
        throw new SandboxError(`pod ${this.namespace}/${name ?? '?'} is not running`);
      }
      const id = pod.metadata?.labels?.[SANDBOX_ID_LABEL];
      const home = id ? homeClaimName(id) : undefined;
      const disk = home ? await this.podStatfs(pod, home).catch(() => undefined) : undefined;
      return usage.read(
        pod,
        disk ? { used: Math.max(0, disk.total - disk.free), total: disk.total } : undefined,
      );
    };
  }

  /**
   * The file system of claim `claim` as a ready pod of this provider that mounts it sees it
   * (envd's statfs of the mount, with the pod's control token from its Secret); undefined when
   * no ready pod mounts it.
   */
  private async claimStatfs(claim: string): Promise<{ total: number; free: number } | undefined> {
    for (const pod of this.pods.values()) {
      const found = await this.podStatfs(pod, claim).catch(() => undefined);
      if (found) return found;
    }
    return undefined;
  }

  /** {@link claimStatfs} in one pod; undefined when it is not ready or does not mount `claim`. */
  private async podStatfs(
    pod: V1Pod,
    claim: string,
  ): Promise<{ total: number; free: number } | undefined> {
    const volume = pod.spec?.volumes?.find((v) => v.persistentVolumeClaim?.claimName === claim);
    const main = pod.spec?.containers.find((c) => c.name === SANDBOX_CONTAINER);
    const mount = main?.volumeMounts?.find((m) => m.name === volume?.name);
    const progress = podProgress(pod);
    const id = pod.metadata?.labels?.[SANDBOX_ID_LABEL];
    const uid = pod.metadata?.uid;
    if (!volume || !mount || progress.state !== 'ready' || !id || !uid) return undefined;
    let token = this.tokens.get(uid);
    if (!token) {
      const secret = await this.core.readNamespacedSecret({
        name: secretName(id),
        namespace: this.namespace,
      });
      const lines = Buffer.from(secret.data?.[TOKEN_KEY] ?? '', 'base64')
        .toString('utf8')
        .split('\n')
        .filter(Boolean);
      token = lines[1] ?? lines[0];
      if (!token) return undefined;
      this.tokens.set(uid, token);
    }
    const target = this.handleOf(id, uid, progress.podIP, false).envdSocket;
    return envdGet<{ total: number; free: number }>(
      target,
      token,
      `/system/disk?path=${encodeURIComponent(mount.mountPath)}`,
      5000,
    );
  }

  /**
   * True in 'claims' mode: the cluster's SandboxWarmPools pre-start the pods, so the daemon keeps
   * no warm pool of its own for this provider (it would hold claimed pods, pooling twice).
   */
  get poolsItself(): boolean {
    return this.options.agentSandbox === 'claims';
  }

  async create(spec: SandboxSpec): Promise<SandboxHandle> {
    const egress = spec.network === 'internet' ? this.enforceable(spec) : undefined;
    if (this.options.agentSandbox === 'claims') return this.createFromClaim(spec);
    const timeoutMs = this.options.startTimeoutMs ?? 120_000;
    const deadline = Date.now() + timeoutMs;
    const name = podName(spec.id);
    const sandboxesDir = dirname(spec.dir);
    const homeClaim = this.homeOnClaim ? homeClaimName(spec.id) : undefined;
    const pod = this.podOf(spec, homeClaim);
    let made: V1Pod | undefined;
    /** Whether a Sandbox may have been made (then it is what goes, taking its pod). */
    let crdMade = false;
    /** Whether the home claim of a plain pod may have been made (it goes too). */
    let claimMade = false;
    const policyName = networkPolicyName(spec.id);
    const cleanUp = async () => {
      await this.remove(spec.id, undefined, crdMade, egress !== undefined).catch(() => undefined);
      if (claimMade) await this.removeHomeClaim(spec.id).catch(() => undefined);
    };

    const fail = async (why: string, cause?: unknown): Promise<SandboxStartError> => {
      const events = made ? await this.eventsOf(name) : '';
      await cleanUp();
      return new SandboxStartError(
        `sandbox ${spec.id} did not start: ${why}${events && !why.includes(events) ? ` (events: ${events})` : ''}`,
        cause === undefined ? undefined : { cause },
      );
    };
    const call = async <T>(what: string, work: () => Promise<T>): Promise<T> => {
      try {
        return await work();
      } catch (error) {
        const mapped = kubeError(error, what, this.server);
        if (mapped instanceof UnavailableError) {
          await cleanUp();
          throw mapped;
        }
        throw await fail(`${what}: ${kubeMessage(error)}`, error);
      }
    };

    // An internet sandbox's NetworkPolicy exists before its pod: the pod is never without it.
    const policy = egress
      ? await call(`creating NetworkPolicy ${this.namespace}/${policyName}`, () =>
          this.networkPolicies.create(
            egressNetworkPolicy(spec.id, egress, this.policyContext(sandboxesHash(sandboxesDir))),
          ),
        )
      : undefined;
    const crd = await call('asking the cluster for agent-sandbox', () => this.usesAgentSandbox());
    let owner: { name: string; uid: string; kind: 'Pod' | 'Sandbox' };
    if (crd) {
      crdMade = true;
      const body = agentSandbox(
        pod,
        spec.timeoutMs,
        Date.now(),
        homeClaim ? this.homeClaimTemplate(spec, sandboxesDir) : undefined,
      );
      const sandbox = (await call(`creating Sandbox ${this.namespace}/${name}`, () =>
        this.custom.createNamespacedCustomObject({
          group: AGENT_SANDBOX_GROUP,
          version: AGENT_SANDBOX_VERSION,
          namespace: this.namespace,
          plural: SANDBOXES,
          body,
        }),
      )) as AgentSandbox;
      made = { metadata: { name } };
      owner = { name, uid: sandbox.metadata.uid as string, kind: 'Sandbox' };
    } else {
      if (homeClaim) {
        // Owned by nothing: it outlives the pod (a hibernate deletes the pod); kill deletes it.
        claimMade = true;
        await call(`creating PersistentVolumeClaim ${this.namespace}/${homeClaim}`, () =>
          this.core.createNamespacedPersistentVolumeClaim({
            namespace: this.namespace,
            body: {
              apiVersion: 'v1',
              kind: 'PersistentVolumeClaim',
              ...this.homeClaimTemplate(spec, sandboxesDir),
              metadata: {
                ...this.homeClaimTemplate(spec, sandboxesDir).metadata,
                name: homeClaim,
                namespace: this.namespace,
              },
            },
          }),
        );
      }
      made = await call(`creating pod ${this.namespace}/${name}`, () =>
        this.core.createNamespacedPod({ namespace: this.namespace, body: pod }),
      );
      owner = { name, uid: made.metadata?.uid as string, kind: 'Pod' };
    }
    // The policy's owners: the garbage collector deletes it once all of them are gone, so with
    // the sandbox, even one the cluster ends by itself (a Sandbox's shutdownTime) with no daemon
    // running, and only after its pod: never is the pod left without it.
    let policyVersion = policy?.metadata?.resourceVersion;
    const own = async (owners: V1OwnerReference[]) => {
      if (!egress) return;
      const body = egressNetworkPolicy(
        spec.id,
        egress,
        this.policyContext(sandboxesHash(sandboxesDir), owners),
      );
      const replaced = await call(
        `setting the owners of NetworkPolicy ${this.namespace}/${policyName}`,
        () =>
          this.networkPolicies.replace({
            ...body,
            metadata: { ...body.metadata, resourceVersion: policyVersion },
          }),
      );
      policyVersion = replaced.metadata?.resourceVersion;
    };
    const sandboxOwner = crd ? this.sandboxOwner(name, owner.uid) : [];
    // A Sandbox's controller may make its pod again: the Sandbox owns the policy too.
    if (crd) await own(sandboxOwner);
    if (Date.now() >= deadline) throw await fail(this.late(name, timeoutMs));
    await call(`creating secret ${this.namespace}/${secretName(spec.id)}`, () =>
      this.core.createNamespacedSecret({
        namespace: this.namespace,
        body: tokenSecret(spec, this.namespace, owner, envdTokenFile(spec)),
      }),
    );
    return this.awaitPod(spec, {
      first: made,
      // The pod's uid: known now for a pod made here, once its controller made it for a Sandbox.
      ...(crd ? {} : { uid: owner.uid }),
      crd,
      ...(egress ? { egress } : {}),
      deadline,
      timeoutMs,
      claims: this.claimsOf(pod),
      copyHome: true,
      onUid: (uid) => own([...sandboxOwner, { apiVersion: 'v1', kind: 'Pod', name, uid }]),
      fail,
    });
  }

  /** Why a pod is not ready in time: its name, the timeout, what it waited for last. */
  private late(name: string, timeoutMs: number, lastWhy?: string): string {
    return `its pod ${this.namespace}/${name} was not ready within ${timeoutMs} ms${lastWhy ? ` (${lastWhy})` : ''}`;
  }

  /** The owner reference of the Sandbox `name` of `uid`. */
  private sandboxOwner(name: string, uid: string): V1OwnerReference[] {
    return [
      {
        apiVersion: `${AGENT_SANDBOX_GROUP}/${AGENT_SANDBOX_VERSION}`,
        kind: 'Sandbox',
        name,
        uid,
      },
    ];
  }

  /** The pod of `spec` here (its home on `homeClaim` when given). */
  private podOf(spec: SandboxSpec, homeClaim?: string): V1Pod {
    return sandboxPod(spec, {
      namespace: this.namespace,
      runtimeImage: this.options.runtimeImage ?? DEFAULT_RUNTIME_IMAGE,
      baseImage: this.options.baseImage ?? DEFAULT_BASE_IMAGE,
      sandboxesDir: dirname(spec.dir),
      ...(this.options.imagePullPolicy ? { imagePullPolicy: this.options.imagePullPolicy } : {}),
      ...(homeClaim ? { homeClaim } : {}),
    });
  }

  /** The claims a pod mounts (its home's, its volumes'). */
  private claimsOf(pod: V1Pod): string[] {
    return (pod.spec?.volumes ?? []).flatMap((volume) =>
      volume.persistentVolumeClaim ? [volume.persistentVolumeClaim.claimName] : [],
    );
  }

  /**
   * The home claim of `spec` (ReadWriteOnce: one pod at a time; the template's disk, else
   * {@link DEFAULT_DISK_BYTES}), as a Sandbox's volumeClaimTemplate named like the pod's home
   * volume: agent-sandbox then names it as {@link homeClaimName} does.
   */
  private homeClaimTemplate(spec: SandboxSpec, sandboxesDir: string) {
    return {
      metadata: { name: HOME_VOLUME, labels: homeClaimLabels(spec.id, sandboxesDir) },
      spec: claimSpec(
        spec.resources.disk ?? DEFAULT_DISK_BYTES,
        'ReadWriteOnce',
        this.options.homeStorageClass,
      ),
    };
  }

  /**
   * Waits until the sandbox's pod is ready and its envd answers, and returns its handle (the
   * template's home copied in first, with `copyHome`). `uid`: the pod's, when made here; else the
   * first pod of its name not `stale` (a Sandbox's controller makes it), `onUid` told of it.
   * While it waits on its claims (`claims`), what they wait for is what a timeout says.
   */
  private async awaitPod(
    spec: SandboxSpec,
    options: {
      first: V1Pod;
      uid?: string;
      stale?: string;
      crd: boolean;
      egress?: EgressPolicy;
      deadline: number;
      timeoutMs: number;
      claims: string[];
      copyHome: boolean;
      onUid: (uid: string) => Promise<void>;
      fail: (why: string, cause?: unknown) => Promise<Error>;
    },
  ): Promise<SandboxHandle> {
    const { deadline, fail } = options;
    const name = podName(spec.id);
    let uid = options.uid;
    let told = false;
    let lastWhy: string | undefined;
    let claimsAt = 0;
    let claimsWhy: string | undefined;
    let current: V1Pod = options.first;
    while (Date.now() < deadline) {
      const seen = current.metadata?.uid;
      if (!uid && seen && seen !== 'deleted' && seen !== options.stale) uid = seen;
      if (uid && !told) {
        told = true;
        await options.onUid(uid);
      }
      const progress: PodProgress = !uid
        ? { state: 'waiting', why: 'the agent-sandbox controller has not made its pod yet' }
        : current.metadata?.uid === uid
          ? podProgress(current)
          : { state: 'failed', why: 'its pod was deleted' };
      if (progress.state === 'failed') throw await fail(progress.why);
      if (progress.state === 'waiting') {
        lastWhy = progress.why;
        // Not scheduled, with claims: a claim the cluster cannot provision is the reason.
        if (
          options.claims.length > 0 &&
          /not scheduled|^the pod is Pending|controller/.test(lastWhy ?? '')
        ) {
          if (Date.now() >= claimsAt) {
            claimsAt = Date.now() + 1000;
            claimsWhy = await this.claimsProblem(options.claims);
          }
          if (claimsWhy) lastWhy = claimsWhy;
        }
      }
      if (progress.state === 'ready') {
        const handle = this.handleOf(
          spec.id,
          uid as string,
          progress.podIP,
          options.crd,
          options.egress,
        );
        if (await envdHealthy(handle.envdSocket)) {
          if (options.copyHome && spec.baseHome) {
            const home = `/home/${spec.user ?? 'user'}`;
            await copyHome(
              handle.envdSocket,
              spec.controlToken ?? spec.accessToken,
              spec.baseHome,
              home,
              Math.max(1000, deadline - Date.now()),
            ).catch(async (error: Error) => {
              throw await fail(`cannot copy the template's home into it: ${error.message}`, error);
            });
          }
          return handle;
        }
        lastWhy = `envd does not answer at ${handle.envdSocket}`;
      }
      current = await this.nextState(name, current, deadline);
    }
    throw await fail(this.late(name, options.timeoutMs, lastWhy));
  }

  /** What keeps a pod's claims from being bound, with what to do; undefined when nothing does. */
  private async claimsProblem(claims: string[]): Promise<string | undefined> {
    for (const claim of claims) {
      const state = await claimState(this.core, this.namespace, claim).catch(() => undefined);
      if (!state || state.state === 'bound') continue;
      const what = `its PersistentVolumeClaim ${this.namespace}/${claim}`;
      if (state.state === 'missing') {
        return `${what} does not exist (deleted outside abx?): ${claim.startsWith('abx-vol-') ? 'the volume is lost; remove it (abx volume rm) and make it again' : 'its home is lost; kill the sandbox'}`;
      }
      const setting = claim.startsWith('abx-vol-')
        ? '--kube-volume-storage-class (ABX_KUBE_VOLUME_STORAGE_CLASS)'
        : '--kube-home-storage-class (ABX_KUBE_HOME_STORAGE_CLASS)';
      if (state.state === 'failed')
        return `${what} is ${state.why}; ${claimAdvice(state.why, setting)}`;
      return `${what} is ${state.why}`;
    }
    return undefined;
  }

  /**
   * Why sandboxes cannot hibernate here, or undefined when they can: their home must be on a
   * claim of its own (`--kube-home pvc`), and claims mode gives none (a warm pool's pods are
   * made from a template shared by every sandbox).
   */
  hibernateUnavailable(): string | undefined {
    if (this.options.agentSandbox === 'claims') {
      return "hibernate is not given in claims mode (--kube-agent-sandbox claims): a claimed pod's home is the warm pool's emptyDir; use --kube-agent-sandbox true or false with --kube-home pvc";
    }
    if (!this.homeOnClaim) {
      return 'on kubernetes a hibernate keeps only a home on a PersistentVolumeClaim of its own, and this daemon puts homes on emptyDirs (gone with the pod): start it with --kube-home pvc (ABX_KUBE_HOME=pvc) for sandboxes that can hibernate (docs/providers.md, "Hibernate")';
    }
    return undefined;
  }

  /**
   * Ends the sandbox's pod and keeps its home claim (home and /tmp): a Sandbox is suspended
   * (`operatingMode: Suspended`; its shutdownTime taken off: a paused sandbox does not time out),
   * a plain pod is deleted with its token Secret and NetworkPolicy (made again by `wake`). Waits
   * until the pod is gone. Again on a hibernated one (a daemon that died mid-way, a wake it did
   * not finish): whatever pod of its name there is goes. A sandbox whose home is not on a claim
   * (made before `--kube-home pvc`) is refused, running on.
   */
  async hibernate(handle: SandboxHandle, spec: SandboxSpec): Promise<void> {
    const why = this.hibernateUnavailable();
    if (why) throw new InvalidArgumentError(`sandbox ${spec.id} cannot hibernate: ${why}`);
    const name = podName(spec.id);
    const pod =
      this.pods.get(name) ??
      (await this.core
        .readNamespacedPod({ name, namespace: this.namespace })
        .catch((error: unknown) => {
          if (statusOf(error) === 404) return undefined;
          throw kubeError(error, `reading pod ${this.namespace}/${name}`, this.server);
        }));
    if (pod && !this.claimsOf(pod).includes(homeClaimName(spec.id))) {
      throw new InvalidArgumentError(
        `sandbox ${spec.id} cannot hibernate: its home is on an emptyDir (it was made before the daemon had --kube-home pvc), which goes with its pod; it runs on`,
      );
    }
    if (handle.pod?.sandbox) {
      await this.setOperatingMode(name, 'Suspended');
      await this.podGone(name);
    } else {
      await this.remove(spec.id, undefined, false, handle.pod?.egress !== undefined);
    }
    this.gone.add(handle.startTime);
  }

  /**
   * Starts a hibernated sandbox's pod again on its home claim: a Sandbox set `Running` (its
   * controller makes the pod, its Secret and policy kept with it), or the pod made anew with its
   * token Secret (and NetworkPolicy: its policy as the handle has it, made first). The claim
   * holds what the home had; envd gets its tokens afresh. A failure leaves it hibernated.
   */
  async wake(handle: SandboxHandle, spec: SandboxSpec): Promise<SandboxHandle> {
    const why = this.hibernateUnavailable();
    if (why) throw new InvalidArgumentError(`sandbox ${spec.id} cannot wake: ${why}`);
    const timeoutMs = this.options.startTimeoutMs ?? 120_000;
    const deadline = Date.now() + timeoutMs;
    const name = podName(spec.id);
    const claim = homeClaimName(spec.id);
    const egress = handle.pod?.egress;
    const crd = handle.pod?.sandbox === true;
    const state = await claimState(this.core, this.namespace, claim).catch((error: unknown) => {
      throw kubeError(
        error,
        `reading PersistentVolumeClaim ${this.namespace}/${claim}`,
        this.server,
      );
    });
    if (state.state === 'missing') {
      throw new SandboxStartError(
        `sandbox ${spec.id} did not wake: the PersistentVolumeClaim of its home (${this.namespace}/${claim}) is gone, deleted outside abx: its files are lost; kill it (abx kill ${spec.id})`,
      );
    }
    const pod = this.podOf(spec, claim);
    let made: V1Pod = { metadata: { name } };
    // What a wake that fails undoes: the pod again (the claim stays, the sandbox hibernated).
    const fail = async (reason: string, cause?: unknown): Promise<SandboxStartError> => {
      const events = await this.eventsOf(name);
      if (crd) {
        // Its Secret and policy stay with the Sandbox; only its pod goes.
        await this.setOperatingMode(name, 'Suspended').catch(() => undefined);
        await this.podGone(name).catch(() => undefined);
      } else {
        await this.remove(spec.id, undefined, false, egress !== undefined).catch(() => undefined);
      }
      return new SandboxStartError(
        `sandbox ${spec.id} did not wake: ${reason}${events && !reason.includes(events) ? ` (events: ${events})` : ''}`,
        cause === undefined ? undefined : { cause },
      );
    };
    const call = async <T>(what: string, work: () => Promise<T>): Promise<T> => {
      try {
        return await work();
      } catch (error) {
        const mapped = kubeError(error, what, this.server);
        if (mapped instanceof UnavailableError) throw mapped;
        throw await fail(`${what}: ${kubeMessage(error)}`, error);
      }
    };
    let onUid: (uid: string) => Promise<void> = async () => {};
    if (crd) {
      const sandbox = (await call(`reading Sandbox ${this.namespace}/${name}`, () =>
        this.custom.getNamespacedCustomObject({
          group: AGENT_SANDBOX_GROUP,
          version: AGENT_SANDBOX_VERSION,
          namespace: this.namespace,
          plural: SANDBOXES,
          name,
        }),
      )) as AgentSandbox;
      await call(`setting Sandbox ${this.namespace}/${name} Running`, () =>
        this.setOperatingMode(name, 'Running'),
      );
      if (egress) {
        const owners = this.sandboxOwner(name, sandbox.metadata.uid as string);
        onUid = (uid) =>
          call(`setting the owners of NetworkPolicy ${networkPolicyName(spec.id)}`, () =>
            this.putPolicy(spec.id, { ...handle, startTime: uid }, egress, {
              owners: [...owners, { apiVersion: 'v1', kind: 'Pod', name, uid }],
              sandboxesDir: dirname(spec.dir),
            }),
          );
      }
    } else {
      if (egress) {
        await call(`making NetworkPolicy ${this.namespace}/${networkPolicyName(spec.id)}`, () =>
          this.putPolicy(spec.id, handle, egress, {
            owners: [],
            sandboxesDir: dirname(spec.dir),
          }),
        );
      }
      made = await call(`creating pod ${this.namespace}/${name}`, () =>
        this.core.createNamespacedPod({ namespace: this.namespace, body: pod }),
      );
      const uid = made.metadata?.uid as string;
      await call(`creating secret ${this.namespace}/${secretName(spec.id)}`, () =>
        this.core.createNamespacedSecret({
          namespace: this.namespace,
          body: tokenSecret(spec, this.namespace, { name, uid, kind: 'Pod' }, envdTokenFile(spec)),
        }),
      );
      if (egress) {
        onUid = (podUid) =>
          call(`setting the owners of NetworkPolicy ${networkPolicyName(spec.id)}`, () =>
            this.putPolicy(spec.id, { ...handle, startTime: podUid }, egress, {
              sandboxesDir: dirname(spec.dir),
            }),
          );
      }
    }
    return this.awaitPod(spec, {
      first: made,
      ...(crd ? { stale: handle.startTime } : { uid: made.metadata?.uid as string }),
      crd,
      ...(egress ? { egress } : {}),
      deadline,
      timeoutMs,
      claims: this.claimsOf(pod),
      copyHome: false,
      onUid,
      fail,
    });
  }

  /** Sets a Sandbox's operatingMode; `Suspended` also takes its shutdownTime off. */
  private async setOperatingMode(name: string, mode: OperatingMode): Promise<void> {
    const target = {
      group: AGENT_SANDBOX_GROUP,
      version: AGENT_SANDBOX_VERSION,
      namespace: this.namespace,
      plural: SANDBOXES,
      name,
    };
    try {
      const sandbox = (await this.custom.getNamespacedCustomObject(target)) as AgentSandbox;
      const patch: unknown[] = [{ op: 'add', path: '/spec/operatingMode', value: mode }];
      // A paused sandbox does not time out: its controller must not delete it (and its home).
      if (mode === 'Suspended' && sandbox.spec.shutdownTime) {
        patch.push({ op: 'remove', path: '/spec/shutdownTime' });
      }
      await this.custom.patchNamespacedCustomObject({ ...target, body: patch });
    } catch (error) {
      throw kubeError(error, `setting Sandbox ${this.namespace}/${name} ${mode}`, this.server);
    }
  }

  /** Waits until no pod of `name` is left (a Sandbox's controller deleting it). */
  private async podGone(name: string): Promise<void> {
    const deadline = Date.now() + GONE_MS;
    for (;;) {
      try {
        await this.core.readNamespacedPod({ name, namespace: this.namespace });
      } catch (error) {
        if (statusOf(error) === 404) return;
        throw kubeError(error, `reading pod ${this.namespace}/${name}`, this.server);
      }
      if (Date.now() >= deadline) {
        throw new SandboxError(
          `pod ${this.namespace}/${name} was still there ${GONE_MS} ms after its Sandbox was suspended; its node may be unreachable`,
        );
      }
      await sleep(100);
    }
  }

  /** Deletes sandbox `id`'s home claim (a plain pod's: a Sandbox's goes with it); absent is fine. */
  private async removeHomeClaim(id: string): Promise<void> {
    await this.core
      .deleteNamespacedPersistentVolumeClaim({ name: homeClaimName(id), namespace: this.namespace })
      .catch((error: unknown) =>
        this.unlessGone(error, `deleting PersistentVolumeClaim ${homeClaimName(id)}`),
      );
  }

  isAlive(handle: SandboxHandle): boolean {
    const uid = handle.startTime;
    if (this.gone.has(uid)) return false;
    const name = handle.pod?.name;
    if (!name || !this.synced) return true; // not known yet: the gateway's connect will tell
    const pod = this.pods.get(name);
    if (!pod || pod.metadata?.uid !== uid || pod.metadata?.deletionTimestamp) return false;
    const phase = pod.status?.phase;
    return phase !== 'Failed' && phase !== 'Succeeded';
  }

  endCause(handle: SandboxHandle): EndCause {
    return this.oom.has(handle.startTime) ? 'oom' : 'exited';
  }

  async kill(handle: SandboxHandle): Promise<void> {
    if (handle.pod?.claim) {
      await this.removeClaim(handle.pod.claim, handle.pod.name, handle.startTime);
      this.gone.add(handle.startTime);
      return;
    }
    const id = handle.pod?.name.replace(/^abx-/, '');
    if (!id) return;
    await this.remove(
      id,
      handle.startTime,
      handle.pod?.sandbox === true,
      handle.pod?.egress !== undefined,
    );
    // A plain pod's home claim (a Sandbox's goes with it), once the pod is gone.
    if (this.homeOnClaim && !handle.pod?.sandbox) await this.removeHomeClaim(id);
    this.gone.add(handle.startTime);
  }

  /**
   * A running internet sandbox's new policy: its NetworkPolicy replaced (the CNI applies it to
   * new connections; whether open ones go on is the CNI's choice). A policy with domain entries
   * that would matter is refused, the old one kept.
   */
  async setNetwork(handle: SandboxHandle, policy: EgressPolicy): Promise<SandboxHandle> {
    const pod = handle.pod;
    const id = pod?.name.replace(/^abx-/, '');
    if (!pod?.egress || !id) {
      throw new InvalidArgumentError(
        `sandbox ${id ?? pod?.name ?? '?'} is not on the internet network: it has no NetworkPolicy to change`,
      );
    }
    if (policy.rules) {
      throw new InvalidArgumentError(
        `sandbox ${id}'s egress policy was not changed: network.rules (per-host headers) need abx's egress proxy, which the Kubernetes provider does not run; leave out rules`,
      );
    }
    if (policy.egressProxy) {
      throw new InvalidArgumentError(
        `sandbox ${id}'s egress policy was not changed: network.egressProxy (your SOCKS5 proxy) needs abx's egress proxy, which the Kubernetes provider does not run; leave out egressProxy`,
      );
    }
    const entries = unenforceableEntries(parsePolicy(policy));
    if (entries.length > 0) {
      throw new InvalidArgumentError(
        `sandbox ${id}'s egress policy was not changed: ${domainsRefusal(entries)}`,
      );
    }
    await this.putPolicy(id, handle, policy);
    return { ...handle, pod: { ...pod, egress: policy } };
  }

  /**
   * A new daemon found this sandbox running: its NetworkPolicy is made what the registry says
   * again (made anew if someone deleted it while no daemon ran).
   */
  async adopt(handle: SandboxHandle): Promise<void> {
    const id = handle.pod?.name.replace(/^abx-/, '');
    if (!handle.pod?.egress || !id) return;
    await this.putPolicy(id, handle, handle.pod.egress);
  }

  /**
   * Replaces (or makes) sandbox `id`'s NetworkPolicy with `policy`; owned by its pod (or
   * `owners`) when made. `sandboxesDir`: the daemon's folder, for its label (else the pod's).
   */
  private async putPolicy(
    id: string,
    handle: SandboxHandle,
    policy: EgressPolicy,
    options: { owners?: V1OwnerReference[]; sandboxesDir?: string } = {},
  ): Promise<void> {
    const name = handle.pod?.name as string;
    // The folder's label, from the pod (a policy made anew is found by the sweep too).
    const hash = options.sandboxesDir
      ? sandboxesHash(options.sandboxesDir)
      : this.pods.get(name)?.metadata?.labels?.[SANDBOXES_LABEL];
    const body = egressNetworkPolicy(
      id,
      policy,
      this.policyContext(
        hash,
        options.owners ?? [{ apiVersion: 'v1', kind: 'Pod', name, uid: handle.startTime }],
      ),
    );
    try {
      await this.networkPolicies.put(body);
    } catch (error) {
      throw kubeError(
        error,
        `replacing NetworkPolicy ${this.namespace}/${networkPolicyName(id)}`,
        this.server,
      );
    }
  }

  /**
   * An internet sandbox's policy, if a NetworkPolicy can enforce it: refused in claims mode, and
   * when it names domains that would matter (denied rather than allowed).
   */
  private enforceable(spec: SandboxSpec): EgressPolicy {
    if (this.options.agentSandbox === 'claims') {
      throw new SandboxStartError(
        `sandbox ${spec.id} did not start: the internet network is not given in claims mode (--kube-agent-sandbox claims): a warm pool's pods start before their sandbox exists, so no NetworkPolicy of the sandbox's own can select them; use --kube-agent-sandbox true or false, or network: none or host (docs/providers.md, "The internet network")`,
      );
    }
    const policy = spec.egress ?? { allowOut: [], denyOut: [] };
    // A NetworkPolicy sees addresses, never a request: header rules would silently not apply.
    if (policy.rules) {
      throw new InvalidArgumentError(
        `sandbox ${spec.id} did not start: network.rules (per-host headers) need abx's egress proxy, which the Kubernetes provider does not run; leave out rules (docs/network.md, "Header rules")`,
      );
    }
    // A NetworkPolicy cannot send a pod's traffic through a SOCKS5 proxy either.
    if (policy.egressProxy) {
      throw new InvalidArgumentError(
        `sandbox ${spec.id} did not start: network.egressProxy (your SOCKS5 proxy) needs abx's egress proxy, which the Kubernetes provider does not run; leave out egressProxy (docs/network.md, "Your own egress proxy")`,
      );
    }
    const entries = unenforceableEntries(parsePolicy(policy));
    if (entries.length > 0) {
      throw new InvalidArgumentError(
        `sandbox ${spec.id} did not start: ${domainsRefusal(entries)}`,
      );
    }
    return policy;
  }

  private policyContext(hash: string | undefined, owners?: V1OwnerReference[]) {
    return {
      namespace: this.namespace,
      ...(hash ? { sandboxesHash: hash } : {}),
      permit: this.permit,
      ...(owners ? { owners } : {}),
    };
  }

  /**
   * Moves the sandbox's end in agent-sandbox modes: the claim's `spec.lifecycle` (its controller
   * deletes the claim, and its Sandbox, then), else the Sandbox's `shutdownTime`.
   */
  async setExpiry(handle: SandboxHandle, expiresAt: number): Promise<void> {
    const pod = handle.pod;
    const at = shutdownTime(expiresAt);
    if (pod?.claim) {
      await this.patchShutdown(AGENT_SANDBOX_EXTENSIONS_GROUP, SANDBOX_CLAIMS, pod.namespace, {
        name: pod.claim,
        what: `SandboxClaim ${pod.claim}`,
        patch: {
          op: 'add',
          path: '/spec/lifecycle',
          value: { shutdownTime: at, shutdownPolicy: 'Delete' },
        },
      });
    } else if (pod?.sandbox) {
      // A JSON patch: `add` sets the member whether or not it is there.
      await this.patchShutdown(AGENT_SANDBOX_GROUP, SANDBOXES, pod.namespace, {
        name: pod.name,
        what: `Sandbox ${pod.name}`,
        patch: { op: 'add', path: '/spec/shutdownTime', value: at },
      });
    }
  }

  /** One JSON patch of a custom object's shutdown time; an object already gone is no error. */
  private async patchShutdown(
    group: string,
    plural: string,
    namespace: string,
    target: { name: string; what: string; patch: unknown },
  ): Promise<void> {
    try {
      await this.custom.patchNamespacedCustomObject({
        group,
        version: AGENT_SANDBOX_VERSION,
        namespace,
        plural,
        name: target.name,
        body: [target.patch],
      });
    } catch (error) {
      if (statusOf(error) === 404) return;
      throw kubeError(error, `moving the shutdownTime of ${target.what}`, this.server);
    }
  }

  async sweepOrphans(
    sandboxesDir: string,
    running: ReadonlySet<string>,
    startedBefore?: number,
  ): Promise<string[]> {
    let pods: V1Pod[];
    try {
      pods = (
        await this.core.listNamespacedPod({
          namespace: this.namespace,
          labelSelector: `${MANAGED_BY_LABEL}=${MANAGED_BY},${SANDBOXES_LABEL}=${sandboxesHash(sandboxesDir)}`,
        })
      ).items;
    } catch (error) {
      throw kubeError(error, `listing sandbox pods in ${this.namespace}`, this.server);
    }
    const orphans: string[] = [];
    if (this.options.agentSandbox === 'claims') {
      orphans.push(...(await this.sweepClaims(sandboxesDir, running, startedBefore)));
    }
    /** Ids of pods left alone: their NetworkPolicies stay with them. */
    const kept = new Set<string>();
    for (const pod of pods) {
      const id = pod.metadata?.labels?.[SANDBOX_ID_LABEL];
      if (!id || running.has(id)) continue;
      // A Date once the client has read it (a string in a raw object): both parse.
      const made = new Date(pod.metadata?.creationTimestamp ?? 0).getTime();
      // Young enough to be another daemon's create under way (its row not written yet).
      if (startedBefore !== undefined && !(made < startedBefore)) {
        kept.add(id);
        continue;
      }
      const owned = pod.metadata?.ownerReferences?.some((ref) => ref.kind === 'Sandbox') ?? false;
      const internet = pod.metadata?.labels?.[NETWORK_LABEL] === 'internet';
      await this.remove(id, pod.metadata?.uid, owned, internet);
      orphans.push(id);
    }
    for (const id of await this.sweepNetworkPolicies(sandboxesDir, running, kept, startedBefore)) {
      if (!orphans.includes(id)) orphans.push(id);
    }
    for (const id of await this.sweepLeftovers(sandboxesDir, running, kept, startedBefore)) {
      if (!orphans.includes(id)) orphans.push(id);
    }
    return orphans;
  }

  /**
   * Deletes what a sandbox without a pod may leave of this folder when the registry does not know
   * it: a Sandbox with no pod (suspended: a hibernated sandbox whose row is gone), and a home
   * claim (a plain pod's outlives it). An account that may not list them has made none.
   */
  private async sweepLeftovers(
    sandboxesDir: string,
    running: ReadonlySet<string>,
    kept: ReadonlySet<string>,
    startedBefore?: number,
  ): Promise<string[]> {
    const selector = `${MANAGED_BY_LABEL}=${MANAGED_BY},${SANDBOXES_LABEL}=${sandboxesHash(sandboxesDir)}`;
    const orphan = (metadata: { labels?: Record<string, string>; creationTimestamp?: unknown }) => {
      const id = metadata.labels?.[SANDBOX_ID_LABEL];
      if (!id || running.has(id) || kept.has(id)) return undefined;
      const made = new Date((metadata.creationTimestamp as string | undefined) ?? 0).getTime();
      return startedBefore !== undefined && !(made < startedBefore) ? undefined : id;
    };
    const swept: string[] = [];
    if (
      this.options.agentSandbox !== 'claims' &&
      (await this.usesAgentSandbox().catch(() => false))
    ) {
      let sandboxes: AgentSandbox[] = [];
      try {
        sandboxes = (
          (await this.custom.listNamespacedCustomObject({
            group: AGENT_SANDBOX_GROUP,
            version: AGENT_SANDBOX_VERSION,
            namespace: this.namespace,
            plural: SANDBOXES,
            labelSelector: selector,
          })) as { items: AgentSandbox[] }
        ).items;
      } catch (error) {
        if (statusOf(error) !== 403) {
          throw kubeError(error, `listing Sandboxes in ${this.namespace}`, this.server);
        }
      }
      for (const sandbox of sandboxes) {
        const id = orphan(sandbox.metadata);
        if (!id) continue;
        await this.removePod(id, undefined, true);
        swept.push(id);
      }
    }
    let claims: V1PersistentVolumeClaim[] = [];
    try {
      claims = (
        await this.core.listNamespacedPersistentVolumeClaim({
          namespace: this.namespace,
          labelSelector: selector,
        })
      ).items;
    } catch (error) {
      if (statusOf(error) === 403) return swept;
      throw kubeError(error, `listing PersistentVolumeClaims in ${this.namespace}`, this.server);
    }
    for (const claim of claims) {
      const id = orphan(claim.metadata ?? {});
      if (!id) continue;
      await this.removeHomeClaim(id);
      if (!swept.includes(id)) swept.push(id);
    }
    return swept;
  }

  /**
   * Deletes the NetworkPolicies of this folder whose sandbox the registry does not know and
   * that select nothing: neither its pod nor a Sandbox that would make one is there (a create
   * that failed before it could clean up, a daemon killed meanwhile). A policy whose pod is still
   * there waits for that pod to be swept (then {@link remove} takes both). An account that may
   * not list NetworkPolicies has made none: nothing to do.
   */
  private async sweepNetworkPolicies(
    sandboxesDir: string,
    running: ReadonlySet<string>,
    kept: ReadonlySet<string>,
    startedBefore?: number,
  ): Promise<string[]> {
    let policies: Awaited<ReturnType<NetworkPolicies['list']>>;
    try {
      policies = await this.networkPolicies.list(
        `${MANAGED_BY_LABEL}=${MANAGED_BY},${SANDBOXES_LABEL}=${sandboxesHash(sandboxesDir)}`,
      );
    } catch (error) {
      if (statusOf(error) === 403) return [];
      throw kubeError(error, `listing NetworkPolicies in ${this.namespace}`, this.server);
    }
    const swept: string[] = [];
    for (const policy of policies) {
      const id = policy.metadata?.labels?.[SANDBOX_ID_LABEL];
      if (!id || running.has(id) || kept.has(id)) continue;
      const made = new Date(policy.metadata?.creationTimestamp ?? 0).getTime();
      if (startedBefore !== undefined && !(made < startedBefore)) continue;
      if (await this.selectsSomething(id)) continue;
      try {
        if (await this.networkPolicies.delete(networkPolicyName(id))) swept.push(id);
      } catch (error) {
        throw kubeError(error, `deleting NetworkPolicy ${networkPolicyName(id)}`, this.server);
      }
    }
    return swept;
  }

  /** Whether sandbox `id`'s pod is there, or a Sandbox that makes it. */
  private async selectsSomething(id: string): Promise<boolean> {
    const name = podName(id);
    const there = (error: unknown, what: string): boolean => {
      if (statusOf(error) === 404) return false;
      throw kubeError(error, what, this.server);
    };
    const pod = await this.core.readNamespacedPod({ name, namespace: this.namespace }).then(
      () => true,
      (error: unknown) => there(error, `reading pod ${this.namespace}/${name}`),
    );
    if (pod || !(await this.usesAgentSandbox().catch(() => false))) return pod;
    return this.custom
      .getNamespacedCustomObject({
        group: AGENT_SANDBOX_GROUP,
        version: AGENT_SANDBOX_VERSION,
        namespace: this.namespace,
        plural: SANDBOXES,
        name,
      })
      .then(
        () => true,
        (error: unknown) => there(error, `reading Sandbox ${this.namespace}/${name}`),
      );
  }

  internetUnavailable(): string | undefined {
    return this.options.agentSandbox === 'claims' ? CLAIMS_NO_INTERNET : undefined;
  }

  /**
   * No workspaces (docs/workspaces.md): the overlay of a host folder, or of a remote client's
   * uploaded one, is mounted on the daemon's host, and a pod runs on a node of the cluster.
   */
  workspaceUnavailable(): string {
    return "the kubernetes provider has no workspaces: a workspace is an overlay mounted on the daemon's host (of a host folder, or of a client's uploaded one), and a sandbox here is a pod on a node of the cluster, which cannot mount it; create the sandbox through a daemon with the local or docker provider (abx daemon start --provider local), or copy the files in (sandbox.files.write)";
  }

  isolation(): IsolationReport {
    const limits: IsolationReport['limits'] = {
      processes: {
        enforced: false,
        how: "not enforced by the pod: the node's kubelet sets the pid limit (podPidsLimit)",
      },
      memory: { enforced: true, how: "the container's memory limit (resources.memory), a cgroup" },
      cpu: { enforced: true, how: "the container's cpu limit (resources.cpu), a CFS quota" },
      disk: {
        enforced: true,
        how: this.homeOnClaim
          ? "home and /tmp on a PersistentVolumeClaim of the template's disk size (--kube-home pvc; its storage bounds it), the rest of the container's writes by the ephemeral-storage limit: the kubelet evicts a pod past it"
          : 'the ephemeral-storage limit (resources.disk): the kubelet evicts a pod past it',
      },
      open_files: {
        enforced: false,
        how: "not enforced: pods have no rlimits; the container runtime's default applies",
      },
      file_size: {
        enforced: false,
        how: "not enforced: pods have no rlimits; the container runtime's default applies",
      },
      egress:
        this.options.agentSandbox === 'claims'
          ? { enforced: false, how: CLAIMS_NO_INTERNET }
          : {
              enforced: true,
              how: "internet network: a NetworkPolicy per sandbox, TCP to the policy's CIDRs less the always-denied ranges, DNS to the cluster's DNS only; enforced by the cluster's CNI (it must enforce NetworkPolicy egress); domain entries are refused (a NetworkPolicy matches addresses only) (docs/providers.md)",
            },
      pause: {
        enforced: false,
        how: `no pause with memory (the Kubernetes API has no cgroup freezer); ${
          this.hibernateUnavailable() === undefined
            ? 'hibernate (memory: false) ends the pod and keeps its home claim (a Sandbox is set Suspended)'
            : `no hibernate either: ${this.hibernateUnavailable()}`
        }`,
      },
      volume_quota:
        this.volumes.unavailable() === undefined
          ? {
              enforced: true,
              how: 'a PersistentVolumeClaim of its size per volume: a block storage class bounds it; a share class (NFS, EFS) does not, and the volume’s info then says quotaEnforced false',
            }
          : { enforced: false, how: `no volumes: ${this.volumes.unavailable()}` },
    };
    return {
      mode: 'rootless',
      limits,
      warnings: [
        `kubernetes: pods in namespace ${this.namespace} of ${this.server} run as uid 1000 with no capabilities and the RuntimeDefault seccomp profile; a template's kubernetes.runtime_class (gVisor, Kata) adds a sandboxed kernel`,
        "kubernetes: a pod always has the cluster's network (the control plane reaches envd at its address); network: none holds only where a NetworkPolicy denies egress to pods labelled abx.dev/network=none (deploy/kubernetes/networkpolicy.yaml does)",
        ...(this.options.agentSandbox === 'claims'
          ? []
          : [
              "kubernetes: internet sandboxes' egress holds only where the cluster's CNI enforces NetworkPolicy egress (Calico, Cilium, Antrea do; flannel alone does not); names resolve through the cluster's DNS for every name, and a denied address is dropped by the CNI, not refused with a reason",
            ]),
        ...Object.entries(limits)
          .filter(([, limit]) => !limit.enforced)
          .map(([name, limit]) => `${name}: ${limit.how}`),
      ],
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.rewatch);
    await this.informer?.stop().catch(() => undefined);
    this.informer = undefined;
  }

  /** The handle of a ready pod (`egress`: an internet sandbox's policy). */
  private handleOf(
    id: string,
    uid: string,
    podIP: string,
    crd: boolean,
    egress?: EgressPolicy,
  ): SandboxHandle {
    const host = podIP.includes(':') ? `[${podIP}]` : podIP;
    return {
      provider: this.name,
      pid: 0,
      startTime: uid,
      envdSocket: tcpTarget(podIP, ENVD_PORT),
      portsDir: `tcp://${host}`,
      pod: {
        namespace: this.namespace,
        name: podName(id),
        ...(crd ? { sandbox: true } : {}),
        ...(egress ? { egress } : {}),
      },
    };
  }

  /**
   * 'claims': a SandboxClaim on the template's SandboxWarmPool; once the claim is bound to a ready
   * pod (its status: Ready, the Sandbox's name and pod IPs), that pod's envd, started with the
   * template's bootstrap tokens, is given the sandbox's own (`PUT /tokens`, once: the bootstrap
   * tokens are refused from then on), then the create's variables and the template's home.
   * Only then is the handle returned; any failure deletes the claim (and what it owns) first.
   */
  private async createFromClaim(spec: SandboxSpec): Promise<SandboxHandle> {
    const timeoutMs = this.options.startTimeoutMs ?? 120_000;
    const deadline = Date.now() + timeoutMs;
    const claimName = podName(spec.id);
    const sandboxesDir = dirname(spec.dir);
    const pod = sandboxPod(spec, {
      namespace: this.namespace,
      runtimeImage: this.options.runtimeImage ?? DEFAULT_RUNTIME_IMAGE,
      baseImage: this.options.baseImage ?? DEFAULT_BASE_IMAGE,
      sandboxesDir,
      ...(this.options.imagePullPolicy ? { imagePullPolicy: this.options.imagePullPolicy } : {}),
    });
    // The name comes from the pod with a placeholder Secret: the real one is named after it.
    const template = podTemplateName(templatePod(pod, 'abx-bootstrap'));
    const templated = templatePod(pod, bootstrapSecretName(template));
    let claimMade = false;
    let bound: { name: string; uid?: string } | undefined;
    let lastWhy: string | undefined;
    const fail = async (why: string, cause?: unknown): Promise<SandboxStartError> => {
      if (claimMade) {
        await this.removeClaim(claimName, bound?.name, bound?.uid).catch(() => undefined);
      }
      return new SandboxStartError(
        `sandbox ${spec.id} did not start: ${why}`,
        cause === undefined ? undefined : { cause },
      );
    };
    const call = async <T>(what: string, work: () => Promise<T>): Promise<T> => {
      try {
        return await work();
      } catch (error) {
        const mapped = kubeError(error, what, this.server);
        if (mapped instanceof UnavailableError) {
          if (claimMade) {
            await this.removeClaim(claimName, bound?.name, bound?.uid).catch(() => undefined);
          }
          throw mapped;
        }
        throw await fail(`${what}: ${kubeMessage(error)}`, error);
      }
    };
    const boot = await call(`making SandboxTemplate ${this.namespace}/${template}`, () =>
      this.ensureTemplate(template, templated, sandboxesDir),
    );
    claimMade = true;
    await call(`creating SandboxClaim ${this.namespace}/${claimName}`, () =>
      this.custom.createNamespacedCustomObject({
        group: AGENT_SANDBOX_EXTENSIONS_GROUP,
        version: AGENT_SANDBOX_VERSION,
        namespace: this.namespace,
        plural: SANDBOX_CLAIMS,
        body: sandboxClaim(spec, claimName, this.namespace, template, sandboxesDir),
      }),
    );
    while (Date.now() < deadline) {
      let claim: ClaimStatus;
      try {
        claim = (await this.custom.getNamespacedCustomObject({
          group: AGENT_SANDBOX_EXTENSIONS_GROUP,
          version: AGENT_SANDBOX_VERSION,
          namespace: this.namespace,
          plural: SANDBOX_CLAIMS,
          name: claimName,
        })) as ClaimStatus;
      } catch (error) {
        if (statusOf(error) === 404) throw await fail('its SandboxClaim was deleted');
        const mapped = kubeError(error, `reading SandboxClaim ${claimName}`, this.server);
        if (mapped instanceof UnavailableError) {
          await this.removeClaim(claimName, bound?.name, bound?.uid).catch(() => undefined);
          throw mapped;
        }
        await sleep(200);
        continue;
      }
      const progress = claimProgress(claim);
      if (claim.status?.sandbox?.name)
        bound = { name: claim.status.sandbox.name, ...(bound?.uid ? { uid: bound.uid } : {}) };
      if (!progress.bound) {
        lastWhy = progress.why;
        // Bound to a Sandbox whose pod cannot start: no use waiting for it.
        const pod = claim.status?.sandbox?.name && this.pods.get(claim.status.sandbox.name);
        const state = pod ? podProgress(pod) : undefined;
        if (state?.state === 'failed') throw await fail(state.why);
        await sleep(Math.max(0, Math.min(200, deadline - Date.now())));
        continue;
      }
      const current =
        this.pods.get(progress.sandbox) ??
        (await this.core
          .readNamespacedPod({ name: progress.sandbox, namespace: this.namespace })
          .catch(() => undefined));
      const uid = current?.metadata?.uid;
      const state = current ? podProgress(current) : undefined;
      if (state?.state === 'failed') throw await fail(state.why);
      if (!uid || state?.state !== 'ready') {
        lastWhy =
          state?.state === 'waiting' ? state.why : `its pod ${progress.sandbox} is not ready`;
        await sleep(Math.max(0, Math.min(200, deadline - Date.now())));
        continue;
      }
      bound = { name: progress.sandbox, uid };
      const handle: SandboxHandle = {
        ...this.handleOf(spec.id, uid, state.podIP, false),
        pod: { namespace: this.namespace, name: progress.sandbox, claim: claimName },
      };
      if (!(await envdHealthy(handle.envdSocket))) {
        lastWhy = `envd does not answer at ${handle.envdSocket}`;
        await sleep(Math.max(0, Math.min(200, deadline - Date.now())));
        continue;
      }
      const control = spec.controlToken ?? randomBytes(32).toString('base64url');
      const left = () => Math.max(1000, deadline - Date.now());
      try {
        await envdPut(
          handle.envdSocket,
          boot.control,
          '/tokens',
          { client: spec.accessToken, control },
          left(),
        );
        const env = claimedEnv(pod);
        if (Object.keys(env).length > 0) {
          await envdPut(handle.envdSocket, control, '/env', { env }, left());
        }
        if (spec.baseHome) {
          await copyHome(
            handle.envdSocket,
            control,
            spec.baseHome,
            `/home/${spec.user ?? 'user'}`,
            left(),
          );
        }
      } catch (error) {
        throw await fail(
          `cannot hand its pod ${progress.sandbox} to it: ${(error as Error).message}`,
          error,
        );
      }
      return handle;
    }
    throw await fail(
      `its SandboxClaim ${this.namespace}/${claimName} was not bound to a ready pod within ${timeoutMs} ms${lastWhy ? ` (${lastWhy})` : ''}`,
    );
  }

  /** 'claims': deletes the labelled SandboxClaims of this folder that the registry does not know. */
  private async sweepClaims(
    sandboxesDir: string,
    running: ReadonlySet<string>,
    startedBefore?: number,
  ): Promise<string[]> {
    let claims: (ClaimStatus & {
      metadata: { name: string; labels?: Record<string, string>; creationTimestamp?: string };
    })[];
    try {
      const list = (await this.custom.listNamespacedCustomObject({
        group: AGENT_SANDBOX_EXTENSIONS_GROUP,
        version: AGENT_SANDBOX_VERSION,
        namespace: this.namespace,
        plural: SANDBOX_CLAIMS,
        labelSelector: `${MANAGED_BY_LABEL}=${MANAGED_BY},${SANDBOXES_LABEL}=${sandboxesHash(sandboxesDir)}`,
      })) as { items: typeof claims };
      claims = list.items;
    } catch (error) {
      throw kubeError(error, `listing SandboxClaims in ${this.namespace}`, this.server);
    }
    const orphans: string[] = [];
    for (const claim of claims) {
      const id = claim.metadata.labels?.[SANDBOX_ID_LABEL];
      if (!id || running.has(id)) continue;
      const made = new Date(claim.metadata.creationTimestamp ?? 0).getTime();
      if (startedBefore !== undefined && !(made < startedBefore)) continue;
      await this.removeClaim(claim.metadata.name, claim.status?.sandbox?.name);
      orphans.push(id);
    }
    return orphans;
  }

  /**
   * The SandboxTemplate, its bootstrap Secret and its SandboxWarmPool for one pod template, made
   * once per provider (another daemon, or an earlier run, may have made them: then they are
   * used, the Secret's tokens read back). Resolves to the bootstrap tokens.
   */
  private ensureTemplate(
    name: string,
    pod: V1Pod,
    sandboxesDir: string,
  ): Promise<{ client: string; control: string }> {
    let made = this.templates.get(name);
    if (made) return made;
    made = (async () => {
      const ext = {
        group: AGENT_SANDBOX_EXTENSIONS_GROUP,
        version: AGENT_SANDBOX_VERSION,
        namespace: this.namespace,
      };
      let uid: string;
      try {
        const created = (await this.custom.createNamespacedCustomObject({
          ...ext,
          plural: SANDBOX_TEMPLATES,
          body: sandboxTemplate(pod, name, sandboxesDir),
        })) as { metadata: { uid: string } };
        uid = created.metadata.uid;
      } catch (error) {
        if (statusOf(error) !== 409) throw error;
        const existing = (await this.custom.getNamespacedCustomObject({
          ...ext,
          plural: SANDBOX_TEMPLATES,
          name,
        })) as { metadata: { uid: string } };
        uid = existing.metadata.uid;
      }
      const secret = bootstrapSecretName(name);
      let tokens: { client: string; control: string } | undefined;
      try {
        tokens = tokensOf(
          await this.core.readNamespacedSecret({ name: secret, namespace: this.namespace }),
        );
      } catch (error) {
        if (statusOf(error) !== 404) throw error;
      }
      if (!tokens) {
        const fresh = bootstrapTokens();
        try {
          await this.core.createNamespacedSecret({
            namespace: this.namespace,
            body: bootstrapSecret({ name, uid }, this.namespace, sandboxesDir, fresh),
          });
          tokens = fresh;
        } catch (error) {
          if (statusOf(error) !== 409) throw error;
          tokens = tokensOf(
            await this.core.readNamespacedSecret({ name: secret, namespace: this.namespace }),
          );
          if (!tokens)
            throw new SandboxError(`the bootstrap Secret ${secret} holds no tokens: delete it`);
        }
      }
      try {
        await this.custom.createNamespacedCustomObject({
          ...ext,
          plural: SANDBOX_WARM_POOLS,
          body: sandboxWarmPool(
            name,
            this.namespace,
            sandboxesDir,
            this.options.warmPoolReplicas ?? 1,
          ),
        });
      } catch (error) {
        if (statusOf(error) !== 409) throw error;
      }
      return tokens;
    })();
    this.templates.set(name, made);
    made.catch(() => this.templates.delete(name));
    return made;
  }

  /**
   * Deletes a SandboxClaim (its Sandbox and pod go with it, owned by it) and waits until its pod
   * (`podName` of `uid`, when known) is gone from the API server. Absent is fine.
   */
  private async removeClaim(claim: string, podName?: string, uid?: string): Promise<void> {
    await this.custom
      .deleteNamespacedCustomObject({
        group: AGENT_SANDBOX_EXTENSIONS_GROUP,
        version: AGENT_SANDBOX_VERSION,
        namespace: this.namespace,
        plural: SANDBOX_CLAIMS,
        name: claim,
        propagationPolicy: 'Background',
      })
      .catch((error: unknown) => this.unlessGone(error, `deleting SandboxClaim ${claim}`));
    if (!podName) return;
    const deadline = Date.now() + GONE_MS;
    for (;;) {
      try {
        const pod = await this.core.readNamespacedPod({ name: podName, namespace: this.namespace });
        if (uid && pod.metadata?.uid !== uid) return;
        // The garbage collector deletes it after its Sandbox; this makes it go without waiting.
        if (uid && !pod.metadata?.deletionTimestamp) {
          await this.core
            .deleteNamespacedPod({
              name: podName,
              namespace: this.namespace,
              gracePeriodSeconds: 1,
              body: { preconditions: { uid } },
            })
            .catch(() => undefined);
        }
      } catch (error) {
        if (statusOf(error) === 404) return;
        throw kubeError(error, `reading pod ${this.namespace}/${podName}`, this.server);
      }
      if (Date.now() >= deadline) {
        throw new SandboxError(
          `pod ${this.namespace}/${podName} was still there ${GONE_MS} ms after its SandboxClaim ${claim} was deleted; its node may be unreachable`,
        );
      }
      await sleep(100);
    }
  }

  /** True when sandboxes are made as agent-sandbox Sandboxes (found once by discovery). */
  usesAgentSandbox(): Promise<boolean> {
    const wanted = this.options.agentSandbox ?? 'auto';
    if (wanted !== 'auto') return Promise.resolve(wanted === true);
    this.crds ??= this.config
      .makeApiClient(ApisApi)
      .getAPIVersions()
      .then((list) =>
        list.groups.some(
          (group) =>
            group.name === AGENT_SANDBOX_GROUP &&
            group.versions.some((v) => v.version === AGENT_SANDBOX_VERSION),
        ),
      )
      .catch((error: unknown) => {
        this.crds = undefined;
        throw error;
      });
    return this.crds;
  }

  /**
   * The pod's next state: from the watch when it says something, else read again (a watch that
   * has not synced, or lost its connection, must not stall a create).
   */
  private async nextState(name: string, current: V1Pod, deadline: number): Promise<V1Pod> {
    await new Promise<void>((resolve) => {
      const waiters = this.waiters.get(name) ?? new Set();
      const done = () => {
        clearTimeout(timer);
        waiters.delete(done);
        if (waiters.size === 0) this.waiters.delete(name);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, Math.min(500, deadline - Date.now())));
      waiters.add(done);
      this.waiters.set(name, waiters);
    });
    const watched = this.pods.get(name);
    const known = current.metadata?.uid;
    if (watched && (!known || known === 'deleted' || watched.metadata?.uid === known)) {
      if (watched.metadata?.resourceVersion !== current.metadata?.resourceVersion) return watched;
    }
    if (Date.now() >= deadline) return current;
    try {
      return await this.core.readNamespacedPod({ name, namespace: this.namespace });
    } catch (error) {
      if (statusOf(error) === 404) return { metadata: { name, uid: 'deleted' } };
      const mapped = kubeError(error, `reading pod ${this.namespace}/${name}`, this.server);
      if (mapped instanceof UnavailableError) throw mapped;
      return current;
    }
  }

  /** The pod's warning events, for a start error (best effort). */
  private async eventsOf(name: string): Promise<string> {
    try {
      const list = await this.core.listNamespacedEvent({
        namespace: this.namespace,
        fieldSelector: `involvedObject.kind=Pod,involvedObject.name=${name}`,
      });
      return eventSummary(list.items);
    } catch {
      return '';
    }
  }

  /**
   * Deletes sandbox `id`'s pod (of uid `uid` when given) and its Secret, and waits until the API
   * server no longer has the pod: its containers are gone from the node. Then, with `policy`, its
   * NetworkPolicy: never before, since a pod that no policy selects may reach everything.
   * Absent is fine.
   */
  private async remove(id: string, uid?: string, sandbox = false, policy = false): Promise<void> {
    if (!(await this.removePod(id, uid, sandbox)) || !policy) return;
    await this.networkPolicies
      .delete(networkPolicyName(id))
      .catch((error: unknown) =>
        this.unlessGone(error, `deleting NetworkPolicy ${networkPolicyName(id)}`),
      );
  }

  /**
   * {@link remove}'s pod part: true once the pod is gone, false when the pod of that name is
   * another of uid (it and its policy stay).
   */
  private async removePod(id: string, uid?: string, sandbox = false): Promise<boolean> {
    const name = podName(id);
    const deadline = Date.now() + GONE_MS;
    if (sandbox) {
      // Its controller would make the pod again: the Sandbox goes first, its pod with it.
      await this.custom
        .deleteNamespacedCustomObject({
          group: AGENT_SANDBOX_GROUP,
          version: AGENT_SANDBOX_VERSION,
          namespace: this.namespace,
          plural: SANDBOXES,
          name,
          propagationPolicy: 'Background',
        })
        .catch((error: unknown) => this.unlessGone(error, `deleting Sandbox ${name}`));
    }
    await this.core
      .deleteNamespacedSecret({ name: secretName(id), namespace: this.namespace })
      .catch((error: unknown) => this.unlessGone(error, `deleting secret ${secretName(id)}`));
    try {
      await this.core.deleteNamespacedPod({
        name,
        namespace: this.namespace,
        // 1 s, not 0: with 0 the API forgets the pod before its node has stopped it.
        gracePeriodSeconds: 1,
        ...(uid ? { body: { preconditions: { uid } } } : {}),
      });
    } catch (error) {
      if (statusOf(error) === 404) return true;
      // 409: a precondition failed, the pod of that name is another sandbox's.
      if (statusOf(error) === 409) return false;
      throw kubeError(error, `deleting pod ${this.namespace}/${name}`, this.server);
    }
    for (;;) {
      try {
        const pod = await this.core.readNamespacedPod({ name, namespace: this.namespace });
        if (uid && pod.metadata?.uid !== uid) return false;
      } catch (error) {
        if (statusOf(error) === 404) return true;
        throw kubeError(error, `reading pod ${this.namespace}/${name}`, this.server);
      }
      if (Date.now() >= deadline) {
        throw new SandboxError(
          `pod ${this.namespace}/${name} was still there ${GONE_MS} ms after its deletion; its node may be unreachable`,
        );
      }
      await sleep(100);
    }
  }

  private unlessGone(error: unknown, what: string): void {
    if (statusOf(error) === 404) return;
    const mapped = kubeError(error, what, this.server);
    if (mapped instanceof UnavailableError) throw mapped;
  }

  /** Keeps {@link pods} from a list+watch of the provider's pods in its namespace. */
  private watchPods(): void {
    if (this.closed) return;
    const labelSelector = `${MANAGED_BY_LABEL}=${MANAGED_BY}`;
    const informer = makeInformer(
      this.config,
      `/api/v1/namespaces/${this.namespace}/pods`,
      () => this.core.listNamespacedPod({ namespace: this.namespace, labelSelector }),
      labelSelector,
    );
    const seen = (pod: V1Pod) => {
      const name = pod.metadata?.name;
      if (!name) return;
      this.pods.set(name, pod);
      if (oomKilled(pod) && pod.metadata?.uid) this.oom.add(pod.metadata.uid);
      for (const wake of [...(this.waiters.get(name) ?? [])]) wake();
    };
    informer.on('add', seen);
    informer.on('update', seen);
    informer.on('delete', (pod) => {
      const name = pod.metadata?.name;
      if (!name) return;
      if (pod.metadata?.uid) {
        this.gone.add(pod.metadata.uid);
        this.tokens.delete(pod.metadata.uid);
        this.usage?.forget(pod.metadata.uid);
      }
      if (oomKilled(pod) && pod.metadata?.uid) this.oom.add(pod.metadata.uid);
      if (this.pods.get(name)?.metadata?.uid === pod.metadata?.uid) this.pods.delete(name);
      for (const wake of [...(this.waiters.get(name) ?? [])]) wake();
    });
    // start() resolves after the list and the watch's answer, or after an error was reported.
    let failed = false;
    const start = () => {
      failed = false;
      informer.start().then(
        () => {
          if (!failed && !this.closed) this.synced = true;
        },
        () => undefined,
      );
    };
    informer.on('error', () => {
      failed = true;
      this.synced = false;
      if (this.closed) return;
      this.rewatch = setTimeout(start, REWATCH_MS);
      this.rewatch.unref();
    });
    this.informer = informer;
    start();
  }
}
