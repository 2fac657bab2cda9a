import type { Duplex } from 'node:stream';

/**
 * Ties two connections together: bytes flow both ways, and when either side ends or fails both
 * are destroyed, so a dead peer never leaves the other end open. Piping starts at once, or when
 * `ready.event` fires on `b` (a socket still connecting), after `ready.first()` has written.
 */
export function splice(a: Duplex, b: Duplex, ready?: { event: string; first(): void }): void {
  const close = () => {
    a.destroy();
    b.destroy();
  };
  for (const side of [a, b]) {
    side.on('error', close);
    side.on('close', close);
  }
  const pipe = () => {
    ready?.first();
    a.pipe(b);
    b.pipe(a);
  };
  if (ready) b.once(ready.event, pipe);
  else pipe();
}
