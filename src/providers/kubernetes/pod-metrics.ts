import type { CustomObjectsApi, V1Pod } from '@kubernetes/client-node';
import { SandboxError } from '../../errors.js';
import type { SandboxUsage } from '../provider.js';
import { kubeError } from './kube-client.js';
import { MANAGED_BY, MANAGED_BY_LABEL, SANDBOX_CONTAINER } from './pod-spec.js';
import { parseQuantity } from './volume-claims.js';

/** The resource metrics API (metrics-server, or an adapter that serves it). */
export const METRICS_GROUP = 'metrics.k8s.io';
export const METRICS_VERSION = 'v1beta1';

/** A `PodMetrics` of metrics.k8s.io/v1beta1, the fields read here. */
export interface PodMetrics {
  metadata: { name: string };
  timestamp?: string;
  window?: string;
  containers: { name: string; usage: { cpu?: string; memory?: string } }[];
}

/** How long one list of the namespace's pod metrics serves every sandbox's reading. */
const LIST_MS = 1000;

/**
 * What a sandbox pod uses, from the resource metrics API: one list of the namespace's abx pods'
 * metrics serves every sandbox of a sampler pass. metrics-server gives each container's CPU use as
 * a rate (cores, averaged over its window) and its memory working set; this turns the rate into
 * the growing CPU time counter the sampler wants, adding rate × time since the previous reading
 * (since the pod started, the first time), so each sample's `cpuUsedPct` is the rate
 * metrics-server measured last. What that API does not give is said as such: no process count
 * (0), no network bytes (null), no page cache (0, the working set leaves most of it out).
 */
export class PodUsage {
  private list: { at: number; items: Promise<Map<string, PodMetrics>> } | undefined;
  /** The CPU time counter of each pod (by uid), and when it was last moved. */
  private readonly counters = new Map<string, { at: number; cpuTimeUs: number }>();

  constructor(
    private readonly custom: CustomObjectsApi,
    private readonly namespace: string,
    private readonly server: string,
  ) {}

  private metrics(): Promise<Map<string, PodMetrics>> {
    const now = Date.now();
    if (this.list && now - this.list.at < LIST_MS) return this.list.items;
    const items = this.custom
      .listNamespacedCustomObject({
        group: METRICS_GROUP,
        version: METRICS_VERSION,
        namespace: this.namespace,
        plural: 'pods',
        labelSelector: `${MANAGED_BY_LABEL}=${MANAGED_BY}`,
      })
      .then(
        (answer) =>
          new Map(
            ((answer as { items?: PodMetrics[] }).items ?? []).map((item) => [
              item.metadata.name,
              item,
            ]),
          ),
      )
      .catch((error: unknown) => {
        this.list = undefined;
        throw kubeError(
          error,
          `listing pod metrics (${METRICS_GROUP}) in ${this.namespace}`,
          this.server,
        );
      });
    this.list = { at: now, items };
    return items;
  }

  /**
   * The use of `pod` (as the provider's watch has it: its limits, its start). `disk`: its home
   * claim's file system where one is mounted, else its ephemeral-storage limit with use unknown.
   */
  async read(pod: V1Pod, disk?: { used: number; total: number }): Promise<SandboxUsage> {
    const name = pod.metadata?.name as string;
    const uid = pod.metadata?.uid as string;
    const metrics = (await this.metrics()).get(name);
    if (!metrics) {
      throw new SandboxError(
        `${METRICS_GROUP} has no metrics of pod ${this.namespace}/${name} yet (metrics-server scrapes each node every 15 s or so)`,
      );
    }
    let cores = 0;
    let memory = 0;
    for (const container of metrics.containers) {
      cores += parseQuantity(container.usage.cpu) || 0;
      memory += parseQuantity(container.usage.memory) || 0;
    }
    const now = Date.now();
    const before = this.counters.get(uid);
    const since =
      before?.at ??
      new Date(pod.status?.startTime ?? pod.metadata?.creationTimestamp ?? now).getTime();
    const cpuTimeUs = (before?.cpuTimeUs ?? 0) + cores * Math.max(0, now - since) * 1000;
    this.counters.set(uid, { at: now, cpuTimeUs });
    const main = pod.spec?.containers.find((c) => c.name === SANDBOX_CONTAINER);
    const limits = main?.resources?.limits ?? {};
    const cpuLimit = parseQuantity(limits.cpu);
    const memLimit = parseQuantity(limits.memory);
    const diskLimit = parseQuantity(limits['ephemeral-storage']);
    return {
      cpuTimeUs,
      cpuCount: cpuLimit > 0 ? cpuLimit : 1,
      memUsed: Math.round(memory),
      memCache: 0,
      memTotal: memLimit > 0 ? Math.round(memLimit) : 0,
      diskUsed: disk?.used ?? 0,
      diskTotal: disk?.total ?? (diskLimit > 0 ? Math.round(diskLimit) : 0),
      processes: 0,
      netRxBytes: null,
      netTxBytes: null,
    };
  }

  /** Forgets a pod that is gone. */
  forget(uid: string): void {
    this.counters.delete(uid);
  }
}
