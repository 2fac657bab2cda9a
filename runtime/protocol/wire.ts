/**
 * The shapes that cross the wire: the daemon's API resources, the command server's command
 * descriptions and envd's process events. Types only; both sides import them, so a field added on
 * one side is seen by the compiler on the other.
 */
import type { ArgSpec, ArgType } from './arguments.js';

// ---------------------------------------------------------------- daemon API (/v1)

/** Where a sandbox is in its life. `pooled`: started ahead of demand, not handed out yet. */
export type SandboxState = 'pooled' | 'running' | 'killed' | 'expired' | 'dead';

/** A sandbox as `GET /v1/sandboxes/:id` shows it (never its token). */
export interface SandboxInfo {
  sandboxId: string;
  template: string;
  state: SandboxState;
  metadata: Record<string, string>;
  capabilities: string[];
  /** ISO 8601 times. */
  createdAt: string;
  expiresAt: string;
  endedAt: string | null;
  /** How it ended: `killed`, `expired`, `dead: oom`... */
  endReason: string | null;
  /** The port envd answers on through the gateway. */
  envdPort: number;
}

// ---------------------------------------------------------------- command server

/** One command in `GET /commands` (an `env` argument is listed as `str`). */
export interface CommandDescription {
  name: string;
  description: string;
  args: (Omit<ArgSpec, 'type'> & { type: ArgType })[];
}

// ---------------------------------------------------------------- envd processes

/** A process as envd's `GET /process` and `start` event describe it. */
export interface ProcessInfoWire {
  id: string;
  pid: number | null;
  command: string;
  cwd: string;
  started_at: string;
  running: boolean;
  exit_code: number | null;
  signal: string | null;
}

/** How a process ended, as envd's `exit` event says. */
export interface ExitWire {
  code: number | null;
  signal: string | null;
  timed_out: boolean;
}

/** The two output streams of a process. */
export type StreamName = 'stdout' | 'stderr';

/** Byte offsets to read (or resume) each stream from. */
export type StreamOffsets = Record<StreamName, number>;

/**
 * One line of an envd event stream (NDJSON; see docs/envd-api.md):
 * - `{"start": {...}}` first, for a new process;
 * - `{"stream","data","offset","next"}`: `data` starts at byte `offset`; resume from `next`;
 * - `{"stream","dropped","offset"}`: the `dropped` bytes before `offset` are gone;
 * - `{"keepalive":true}` while a followed process is silent;
 * - `{"exit": {...}}`, always the last line.
 */
export type ProcessEvent =
  | { start: ProcessInfoWire }
  | { stream: StreamName; data: string; offset: number; next: number }
  | { stream: StreamName; dropped: number; offset: number }
  | { keepalive: true }
  | { exit: ExitWire };
