import type {
  CoreV1Api,
  CoreV1Event,
  V1PersistentVolumeClaim,
  V1PersistentVolumeClaimSpec,
} from '@kubernetes/client-node';
import { SandboxError, UnavailableError } from '../../errors.js';
import type { VolumeSpec, VolumeStore, VolumeUsage } from '../provider.js';
import { kubeError, statusOf } from './kube-client.js';
import {
  MANAGED_BY,
  MANAGED_BY_LABEL,
  SANDBOX_ID_LABEL,
  SANDBOXES_LABEL,
  sandboxesHash,
  volumeClaimName,
} from './pod-spec.js';

/** A claim's access mode: ReadWriteMany (every node), ReadWriteOnce (the pods of one node). */
export type AccessMode = 'ReadWriteMany' | 'ReadWriteOnce';
export const ACCESS_MODES: readonly AccessMode[] = ['ReadWriteMany', 'ReadWriteOnce'];

/** The labels of a volume's claim: its id; its name too where it is a valid label value. */
export const VOLUME_ID_LABEL = 'abx.dev/volume-id';
export const VOLUME_NAME_LABEL = 'abx.dev/volume-name';
/** The volume's name, always (a name such as `_x` is no label value). */
export const VOLUME_NAME_ANNOTATION = 'abx.dev/volume-name';
const LABEL_VALUE = /^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$/;

/** How long a volume's create watches its new claim for a failure to provision it. */
export const SETTLE_MS = 10_000;
/**
 * A file system this much bigger than its claim is not the claim's own (a share of an NFS
 * server, EFS): its size bounds nothing, and what it holds is not only the volume's.
 */
const SHARED_FS_FACTOR = 1.1;

/** A PVC's spec: one access mode, `bytes` of storage, the class when one is named. */
export function claimSpec(
  bytes: number,
  accessMode: AccessMode,
  storageClass?: string,
): V1PersistentVolumeClaimSpec {
  return {
    accessModes: [accessMode],
    resources: { requests: { storage: String(Math.round(bytes)) } },
    ...(storageClass ? { storageClassName: storageClass } : {}),
  };
}

/** The labels of sandbox `id`'s home claim (what the orphan sweep selects by). */
export function homeClaimLabels(id: string, sandboxesDir: string): Record<string, string> {
  return {
    [MANAGED_BY_LABEL]: MANAGED_BY,
    [SANDBOX_ID_LABEL]: id,
    [SANDBOXES_LABEL]: sandboxesHash(sandboxesDir),
  };
}

/** The claim of an abx volume: its size, the daemon's class and access mode, its id and name. */
export function volumeClaim(
  volume: VolumeSpec,
  namespace: string,
  options: { accessMode: AccessMode; storageClass?: string },
): V1PersistentVolumeClaim {
  return {
    apiVersion: 'v1',
    kind: 'PersistentVolumeClaim',
    metadata: {
      name: volumeClaimName(volume.id),
      namespace,
      labels: {
        [MANAGED_BY_LABEL]: MANAGED_BY,
        [VOLUME_ID_LABEL]: volume.id,
        ...(LABEL_VALUE.test(volume.name) ? { [VOLUME_NAME_LABEL]: volume.name } : {}),
      },
      annotations: { [VOLUME_NAME_ANNOTATION]: volume.name },
    },
    spec: claimSpec(volume.sizeBytes, options.accessMode, options.storageClass),
  };
}

const SUFFIXES: Record<string, number> = {
  n: 1e-9,
  u: 1e-6,
  m: 1e-3,
  '': 1,
  k: 1e3,
  K: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
  Ki: 1024,
  Mi: 1024 ** 2,
  Gi: 1024 ** 3,
  Ti: 1024 ** 4,
  Pi: 1024 ** 5,
  Ei: 1024 ** 6,
};

/** A Kubernetes quantity (`250m`, `1Gi`, `123456789n`, `2e3`) as a number; NaN if it is none. */
export function parseQuantity(text: string | undefined): number {
  const match = /^([+-]?\d+(?:\.\d+)?|[+-]?\.\d+)(?:[eE]([+-]?\d+)|([a-zA-Z]{0,2}))$/.exec(
    (text ?? '').trim(),
  );
  if (!match) return Number.NaN;
  const value = Number(match[1]);
  if (match[2] !== undefined) return value * 10 ** Number(match[2]);
  const factor = SUFFIXES[match[3] ?? ''];
  return factor === undefined ? Number.NaN : value * factor;
}

/** Reasons of a claim's events that mean the cluster cannot give it storage as asked. */
const FAILED = new Set(['ProvisioningFailed', 'FailedBinding']);
/** Reasons that mean it is on its way (binding waits for a pod, or a provisioner works on it). */
const COMING = new Set([
  'WaitForFirstConsumer',
  'ExternalProvisioning',
  'Provisioning',
  'ProvisioningSucceeded',
]);

/** Where a claim is: bound, on its way (with why), failing (with the cluster's reason), or gone. */
export type ClaimState =
  | { state: 'bound' }
  | { state: 'coming'; why: string }
  | { state: 'failed'; why: string }
  | { state: 'missing' };

/** What to do about a claim the cluster cannot provision. */
export function claimAdvice(why: string, setting: string): string {
  if (/no storage class is set|storageclass.*not found|not found.*storageclass/i.test(why)) {
    return `name a StorageClass of the cluster with ${setting} (kubectl get storageclass), or give the cluster a default one`;
  }
  if (/access ?mode|ReadWriteMany|RWX/i.test(why)) {
    return `use a StorageClass that gives ReadWriteMany (an NFS, CephFS, EFS, Filestore or Azure Files one) with ${setting}, or --kube-volume-access-mode ReadWriteOnce (then only sandboxes on one node can share a volume)`;
  }
  return `check the StorageClass and its provisioner (kubectl describe pvc), or name another with ${setting}`;
}

/** A claim's state, from its phase and its events (the newest that say something). */
export async function claimState(
  core: CoreV1Api,
  namespace: string,
  name: string,
): Promise<ClaimState> {
  let claim: V1PersistentVolumeClaim;
  try {
    claim = await core.readNamespacedPersistentVolumeClaim({ name, namespace });
  } catch (error) {
    if (statusOf(error) === 404) return { state: 'missing' };
    throw error;
  }
  if (claim.status?.phase === 'Bound') return { state: 'bound' };
  if (claim.metadata?.deletionTimestamp) return { state: 'failed', why: 'it is being deleted' };
  let events: CoreV1Event[] = [];
  try {
    events = (
      await core.listNamespacedEvent({
        namespace,
        fieldSelector: `involvedObject.kind=PersistentVolumeClaim,involvedObject.name=${name}`,
      })
    ).items;
  } catch {
    // Events are a help, not a need.
  }
  const latest = events
    .filter((event) => FAILED.has(event.reason ?? '') || COMING.has(event.reason ?? ''))
    .sort(
      (a, b) =>
        new Date(a.lastTimestamp ?? a.eventTime ?? 0).getTime() -
        new Date(b.lastTimestamp ?? b.eventTime ?? 0).getTime(),
    )
    .pop();
  const phase = claim.status?.phase ?? 'Pending';
  if (latest && FAILED.has(latest.reason ?? '')) {
    return { state: 'failed', why: `${phase}: ${latest.reason}: ${latest.message ?? ''}`.trim() };
  }
  return {
    state: 'coming',
    why: latest ? `${phase}: ${latest.reason}: ${latest.message ?? ''}`.trim() : phase,
  };
}

/** What the volume store asks of its provider. */
export interface KubeVolumesHost {
  core: CoreV1Api;
  namespace: string;
  server: string;
  accessMode: AccessMode;
  storageClass?: string;
  /** Why volumes cannot be had here (claims mode), or undefined. */
  unavailable(): string | undefined;
  /**
   * The file system of a claim as a ready sandbox that mounts it sees it (envd's statfs), or
   * undefined when none does now.
   */
  statfs(claim: string): Promise<{ total: number; free: number } | undefined>;
  /** How long a create watches the new claim (default {@link SETTLE_MS}). */
  settleMs?: number;
}

/**
 * abx volumes as PersistentVolumeClaims, one each (`abx-vol-…`, labelled with the volume's id and
 * name), of the volume's size, in the daemon's class and access mode (ReadWriteMany unless told
 * otherwise), mounted into every sandbox pod that names the volume. Not owned by anything: a
 * claim outlives every sandbox and is deleted by `remove` only.
 */
export class KubeVolumes implements VolumeStore {
  /** The last size of each volume's data a sandbox could measure (this daemon's life). */
  private readonly measured = new Map<string, number>();

  constructor(private readonly host: KubeVolumesHost) {}

  unavailable(): string | undefined {
    return this.host.unavailable();
  }

  private what(volume: VolumeSpec): string {
    return `PersistentVolumeClaim ${this.host.namespace}/${volumeClaimName(volume.id)} of volume ${volume.name}`;
  }

  async create(volume: VolumeSpec): Promise<void> {
    const { core, namespace, server } = this.host;
    const name = volumeClaimName(volume.id);
    try {
      await core.createNamespacedPersistentVolumeClaim({
        namespace,
        body: volumeClaim(volume, namespace, this.host),
      });
    } catch (error) {
      if (statusOf(error) === 409) {
        throw new SandboxError(
          `${this.what(volume)} exists already, made by something else: delete it (kubectl delete pvc -n ${namespace} ${name}) or make the volume again`,
        );
      }
      throw kubeError(error, `creating ${this.what(volume)}`, server);
    }
    // A claim the cluster cannot provision is said now, not at the first sandbox that mounts it.
    const deadline = Date.now() + (this.host.settleMs ?? SETTLE_MS);
    for (;;) {
      let state: ClaimState;
      try {
        state = await claimState(core, namespace, name);
      } catch (error) {
        await this.remove(volume).catch(() => undefined);
        throw kubeError(error, `reading ${this.what(volume)}`, server);
      }
      if (state.state === 'bound') return;
      if (state.state === 'coming' && /WaitForFirstConsumer/.test(state.why)) return;
      if (state.state === 'failed' || state.state === 'missing') {
        await this.remove(volume).catch(() => undefined);
        const why = state.state === 'missing' ? 'it was deleted meanwhile' : state.why;
        throw new UnavailableError(
          `volume ${volume.name} was not made: the cluster cannot provision its ${this.what(volume)} (${why}); ${claimAdvice(why, '--kube-volume-storage-class (ABX_KUBE_VOLUME_STORAGE_CLASS)')}`,
        );
      }
      // Still on its way at the deadline: a sandbox that mounts it waits for it then.
      if (Date.now() >= deadline) return;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  async remove(volume: VolumeSpec): Promise<void> {
    const { core, namespace, server } = this.host;
    try {
      await core.deleteNamespacedPersistentVolumeClaim({
        name: volumeClaimName(volume.id),
        namespace,
      });
    } catch (error) {
      if (statusOf(error) !== 404) throw kubeError(error, `deleting ${this.what(volume)}`, server);
    }
    this.measured.delete(volume.id);
  }

  /**
   * `total`: the claim's capacity (what was provisioned; the request while it is not bound).
   * `used`: the used bytes of its file system, as a ready sandbox that mounts it sees them now
   * (else the last such reading of this daemon, else 0). `enforced`: true, unless that file system
   * is much bigger than the claim (a share: NFS, EFS), which bounds nothing; its used bytes are
   * then not the volume's and `used` says 0.
   */
  async usage(volume: VolumeSpec): Promise<VolumeUsage> {
    const { core, namespace, server } = this.host;
    const name = volumeClaimName(volume.id);
    let claim: V1PersistentVolumeClaim;
    try {
      claim = await core.readNamespacedPersistentVolumeClaim({ name, namespace });
    } catch (error) {
      if (statusOf(error) === 404) {
        throw new SandboxError(
          `${this.what(volume)} is gone (deleted outside abx): its files are lost; remove the volume (abx volume rm ${volume.name})`,
        );
      }
      throw kubeError(error, `reading ${this.what(volume)}`, server);
    }
    const capacity = parseQuantity(
      claim.status?.capacity?.storage ?? claim.spec?.resources?.requests?.storage,
    );
    const total = Number.isFinite(capacity) ? Math.round(capacity) : volume.sizeBytes;
    const fs = await this.host.statfs(name).catch(() => undefined);
    if (fs && fs.total > total * SHARED_FS_FACTOR) {
      return { used: 0, total, enforced: false };
    }
    if (fs) this.measured.set(volume.id, Math.max(0, fs.total - fs.free));
    return { used: this.measured.get(volume.id) ?? 0, total, enforced: true };
  }
}
