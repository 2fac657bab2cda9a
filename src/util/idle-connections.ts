/**
 * Closers of this process's HTTP connection pools, registered by the modules that make them. A
 * kept-alive connection holds a process open for a while after its last request (undici frees
 * its socket only on a timer tick); the CLI, at the end of a command, closes them all so `abx`
 * exits as soon as its work is done. Only modules already loaded have registered: closing loads
 * nothing.
 */
const closers = new Map<string, () => Promise<unknown>>();

/** Registers (or replaces) the closer of the pools known by `key`. */
export function onCloseConnections(key: string, close: () => Promise<unknown>): void {
  closers.set(key, close);
}

/**
 * Closes every registered pool at once: requests still under way are cut (the caller has no use
 * for them), so this never waits on a peer.
 */
export async function closeConnections(): Promise<void> {
  await Promise.all([...closers.values()].map((close) => close().catch(() => undefined)));
}
