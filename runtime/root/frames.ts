/**
 * The sudo socket's framing (root init ↔ the `sudo` shim): one byte of kind, four of length
 * (big-endian), then the payload. One connection is one command.
 */
import type { Socket } from 'node:net';

/** Shim → root: the command (JSON), stdin bytes, stdin's end, a signal's name. */
export const HEADER = 0x48; // H
export const STDIN = 0x49; // I
export const STDIN_END = 0x45; // E
export const SIGNAL = 0x53; // S
/** Root → shim: stdout and stderr bytes, the exit (JSON). */
export const STDOUT = 0x4f; // O
export const STDERR = 0x52; // R
export const EXIT = 0x58; // X

/** A command's header can be long (an argv), never this long: a bigger frame is refused. */
export const MAX_FRAME = 16 * 1024 * 1024;

export interface SudoHeader {
  argv: string[];
  cwd: string;
  env: Record<string, string>;
}

export interface SudoExit {
  code: number | null;
  signal: string | null;
}

export function frame(kind: number, payload: Buffer | string = Buffer.alloc(0)): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const head = Buffer.alloc(5);
  head[0] = kind;
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

/** Calls `onFrame` for each whole frame the socket delivers; a frame over MAX_FRAME ends it. */
export function readFrames(socket: Socket, onFrame: (kind: number, payload: Buffer) => void): void {
  let pending: Buffer = Buffer.alloc(0);
  socket.on('data', (chunk: Buffer) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    while (pending.length >= 5) {
      const length = pending.readUInt32BE(1);
      if (length > MAX_FRAME) {
        socket.destroy(new Error(`a frame of ${length} bytes is over ${MAX_FRAME}`));
        return;
      }
      if (pending.length < 5 + length) break;
      const kind = pending[0] as number;
      const payload = pending.subarray(5, 5 + length);
      pending = pending.subarray(5 + length);
      onFrame(kind, payload);
    }
  });
}
