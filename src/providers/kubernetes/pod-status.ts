import type { CoreV1Event, V1Pod } from '@kubernetes/client-node';

/** Waiting reasons that do not go away by waiting: the pod cannot start as specified. */
const FATAL_WAITING = new Set([
  'ErrImagePull',
  'ImagePullBackOff',
  'InvalidImageName',
  'ErrImageNeverPull',
  'CrashLoopBackOff',
  'CreateContainerConfigError',
  'CreateContainerError',
  'RunContainerError',
  'StartError',
]);

/** Where a pod is on its way to a serving sandbox. */
export type PodProgress =
  | { state: 'ready'; podIP: string }
  | { state: 'waiting'; why: string | undefined }
  | { state: 'failed'; why: string };

/** Every container status of a pod, init containers first. */
function statuses(pod: V1Pod) {
  return [...(pod.status?.initContainerStatuses ?? []), ...(pod.status?.containerStatuses ?? [])];
}

/** Reads a pod's status: ready (with its address), still coming (and why), or never coming. */
export function podProgress(pod: V1Pod): PodProgress {
  const phase = pod.status?.phase;
  for (const status of statuses(pod)) {
    const waiting = status.state?.waiting;
    if (waiting?.reason && FATAL_WAITING.has(waiting.reason)) {
      return {
        state: 'failed',
        why: `container ${status.name}: ${waiting.reason}${waiting.message ? `: ${waiting.message}` : ''}`,
      };
    }
    const ended = status.state?.terminated;
    // An init container that copied what it had to and exited 0 is done, not failed.
    const init = pod.status?.initContainerStatuses?.includes(status) ?? false;
    if (ended && !(init && ended.exitCode === 0)) {
      return {
        state: 'failed',
        why: `container ${status.name} ended: ${ended.reason ?? 'exit'} (exit code ${ended.exitCode})${ended.message ? `: ${ended.message}` : ''}`,
      };
    }
  }
  if (phase === 'Failed' || phase === 'Succeeded') {
    return {
      state: 'failed',
      why: `the pod ${phase === 'Failed' ? 'failed' : 'ended'}${pod.status?.reason ? `: ${pod.status.reason}` : ''}${pod.status?.message ? `: ${pod.status.message}` : ''}`,
    };
  }
  const conditions = pod.status?.conditions ?? [];
  const ready = conditions.find((c) => c.type === 'Ready')?.status === 'True';
  const podIP = pod.status?.podIP;
  if (phase === 'Running' && ready && podIP) return { state: 'ready', podIP };
  const unscheduled = conditions.find((c) => c.type === 'PodScheduled' && c.status === 'False');
  if (unscheduled) {
    return {
      state: 'waiting',
      why: `not scheduled: ${unscheduled.reason ?? 'Pending'}${unscheduled.message ? `: ${unscheduled.message}` : ''}`,
    };
  }
  for (const status of statuses(pod)) {
    const waiting = status.state?.waiting;
    if (waiting?.reason && waiting.reason !== 'PodInitializing') {
      return {
        state: 'waiting',
        why: `container ${status.name}: ${waiting.reason}${waiting.message ? `: ${waiting.message}` : ''}`,
      };
    }
  }
  return { state: 'waiting', why: phase ? `the pod is ${phase}` : undefined };
}

/** The pod's warnings from its events (FailedScheduling, Failed pulls...), newest last. */
export function eventSummary(events: readonly CoreV1Event[]): string {
  const warnings = events
    .filter((event) => event.type === 'Warning')
    .map((event) => `${event.reason ?? 'Warning'}: ${event.message ?? ''}`.trim());
  return [...new Set(warnings)].slice(-3).join('; ');
}

/** True when a pod ended because its memory limit was reached. */
export function oomKilled(pod: V1Pod): boolean {
  return statuses(pod).some((status) =>
    [status.state?.terminated, status.lastState?.terminated].some((t) => t?.reason === 'OOMKilled'),
  );
}
