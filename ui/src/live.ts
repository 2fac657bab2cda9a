/**
 * The live view of the sandboxes the key may see: one `EventSource` on `/v1/events` while
 * signed in (snapshot, then sandbox, ended and metrics events), shared by every page.
 */
import { useEffect, useState } from 'preact/hooks';
import { loadSession, type SandboxInfo, type SandboxMetric, setSession } from './api.js';

/** Samples kept per sandbox for the list's small charts. */
const SPARK_SAMPLES = 60;

export interface LiveState {
  /** Whether the stream is open (false while it reconnects). */
  connected: boolean;
  sandboxes: Map<string, SandboxInfo>;
  metrics: Map<string, SandboxMetric[]>;
  /** The last few sandboxes that ended, with why. */
  ended: Map<string, string | null>;
}

let state: LiveState = {
  connected: false,
  sandboxes: new Map(),
  metrics: new Map(),
  ended: new Map(),
};
const listeners = new Set<() => void>();
let source: EventSource | null = null;
let notifyScheduled = false;

function notify(): void {
  if (notifyScheduled) return;
  notifyScheduled = true;
  queueMicrotask(() => {
    notifyScheduled = false;
    for (const listener of listeners) listener();
  });
}

function update(change: (draft: LiveState) => void): void {
  const draft: LiveState = {
    connected: state.connected,
    sandboxes: new Map(state.sandboxes),
    metrics: new Map(state.metrics),
    ended: new Map(state.ended),
  };
  change(draft);
  state = draft;
  notify();
}

function parse<T>(event: MessageEvent): T | undefined {
  try {
    return JSON.parse(String(event.data)) as T;
  } catch {
    return undefined;
  }
}

function setConnected(connected: boolean): void {
  update((draft) => {
    draft.connected = connected;
  });
}

/** Opens the stream (idempotent). */
export function startLive(): void {
  if (source) return;
  const events = new EventSource('/v1/events');
  source = events;
  events.addEventListener('open', () => setConnected(true));
  events.addEventListener('error', () => {
    setConnected(false);
    // Closed for good (a 401 or another refusal): find out whether the session is still live.
    if (events.readyState === EventSource.CLOSED && source === events) {
      source = null;
      loadSession()
        .then((live) => {
          if (live) setTimeout(startLive, 2000);
          else setSession(null);
        })
        .catch(() => setTimeout(startLive, 5000));
    }
  });
  events.addEventListener('snapshot', (event) => {
    const body = parse<{ sandboxes: SandboxInfo[] }>(event as MessageEvent);
    if (!body) return;
    update((draft) => {
      draft.connected = true;
      draft.sandboxes = new Map(body.sandboxes.map((s) => [s.sandboxId, s]));
      for (const id of draft.metrics.keys()) if (!draft.sandboxes.has(id)) draft.metrics.delete(id);
    });
  });
  events.addEventListener('sandbox', (event) => {
    const body = parse<{ sandbox: SandboxInfo }>(event as MessageEvent);
    if (!body?.sandbox) return;
    update((draft) => {
      const { sandbox } = body;
      if (['killed', 'expired', 'dead'].includes(sandbox.state)) {
        draft.sandboxes.delete(sandbox.sandboxId);
        draft.ended.set(sandbox.sandboxId, sandbox.endReason);
      } else {
        draft.sandboxes.set(sandbox.sandboxId, sandbox);
      }
    });
  });
  events.addEventListener('ended', (event) => {
    const body = parse<{ sandboxId: string; endReason: string | null }>(event as MessageEvent);
    if (!body) return;
    update((draft) => {
      draft.sandboxes.delete(body.sandboxId);
      draft.metrics.delete(body.sandboxId);
      draft.ended.set(body.sandboxId, body.endReason ?? null);
      while (draft.ended.size > 50) draft.ended.delete(draft.ended.keys().next().value as string);
    });
  });
  events.addEventListener('metrics', (event) => {
    const body = parse<{ sandboxId: string; metric: SandboxMetric }>(event as MessageEvent);
    if (!body?.metric) return;
    update((draft) => {
      const list = [...(draft.metrics.get(body.sandboxId) ?? []), body.metric];
      draft.metrics.set(body.sandboxId, list.slice(-SPARK_SAMPLES));
    });
  });
}

/** Closes the stream and forgets what it showed (at sign-out). */
export function stopLive(): void {
  source?.close();
  source = null;
  state = { connected: false, sandboxes: new Map(), metrics: new Map(), ended: new Map() };
  notify();
}

/** Puts a sandbox the page just changed into the list without waiting for its event. */
export function applySandbox(sandbox: SandboxInfo): void {
  update((draft) => {
    if (['killed', 'expired', 'dead'].includes(sandbox.state)) {
      draft.sandboxes.delete(sandbox.sandboxId);
      draft.ended.set(sandbox.sandboxId, sandbox.endReason);
    } else {
      draft.sandboxes.set(sandbox.sandboxId, sandbox);
    }
  });
}

export function useLive(): LiveState {
  const [, setTick] = useState(0);
  useEffect(() => {
    const listener = () => setTick((n) => n + 1);
    listeners.add(listener);
    return () => void listeners.delete(listener);
  }, []);
  return state;
}

/** The current time, re-read every `everyMs` (for ages and time left). */
export function useNow(everyMs = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), everyMs);
    return () => clearInterval(timer);
  }, [everyMs]);
  return now;
}
