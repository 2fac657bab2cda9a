import type { ChildProcess } from 'node:child_process';
import { groupAlive, killGroup, spawnFailure, spawnGroup } from './child-process.js';
import { BadRequestError, NotFoundError } from './errors.js';
import { OutputLog } from './output-log.js';
import type { Identity } from './users.js';

/** A background process (or terminal) the server started and keeps track of. */
export interface ManagedProcess {
  id: string;
  command: string;
  cwd: string;
  child: ChildProcess;
  /** stdout and stderr interleaved, as they arrived. */
  output: OutputLog;
  /** Each stream on its own, for clients that keep them apart (envd's `/exec`). */
  stdout: OutputLog;
  stderr: OutputLog;
  startedAt: string;
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  /** True when the process group was killed because it ran past its timeout. */
  timedOut: boolean;
}

/** What each of a process's own stdout and stderr logs keeps: the newest 16 MiB. */
export const STREAM_LOG_BYTES = 16 * 1024 * 1024;

/** Finished processes kept for replay; older ones are forgotten, so memory stays bounded. */
export const FINISHED_KEPT = 32;

/** Options of {@link ProcessTable.start}. */
export interface StartOptions {
  /** The command line as shown in listings. */
  command: string;
  cwd: string;
  env?: Record<string, string>;
  /** Another user to run as (envd as root only; see users.ts). */
  identity?: Identity;
  /** Past this the whole process group is killed (SIGKILL); absent or 0: no limit. */
  timeoutMs?: number;
}

/** The JSON view of a {@link ManagedProcess}. */
export function processInfo(p: ManagedProcess) {
  return {
    id: p.id,
    pid: p.child.pid ?? null,
    command: p.command,
    cwd: p.cwd,
    started_at: p.startedAt,
    running: !p.output.done,
    exit_code: p.exitCode,
    signal: p.signal,
    output_bytes: p.output.end,
  };
}

/**
 * Background processes by id. Each runs in its own process group, so a kill reaches everything
 * it started; the table kills every group when the server stops.
 */
export class ProcessTable {
  private readonly processes = new Map<string, ManagedProcess>();
  /** Ids of finished processes, oldest first. */
  private readonly finished: string[] = [];
  private nextId: number;

  /**
   * `kind` names the entries in error messages: `process`, `terminal`. `firstId`: the number of
   * the first entry (envd woken from a sleep goes on from where it stopped, so an id names one
   * process for the sandbox's whole life).
   */
  constructor(
    private readonly kind: string,
    firstId = 1,
  ) {
    this.nextId = firstId;
  }

  /** The number the next entry's id will have. */
  get next(): number {
    return this.nextId;
  }

  start(file: string, args: readonly string[], options: StartOptions): Promise<ManagedProcess> {
    const child = spawnGroup(file, args, options);
    const entry = this.track(child, options);
    return new Promise((resolve, reject) => {
      child.once('spawn', () => {
        this.processes.set(entry.id, entry);
        resolve(entry);
      });
      child.once('error', (error) => reject(spawnFailure(error, file, options.cwd)));
    });
  }

  /**
   * Takes into the table a process spawned earlier, in a group of its own with piped stdio, that
   * has not exited (envd's pre-started command server): from now on it is listed, its output is
   * kept and it is killed with the rest. Output it wrote before is kept too, unless read already.
   */
  adopt(child: ChildProcess, options: Omit<StartOptions, 'env' | 'identity'>): ManagedProcess {
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) {
      throw new Error('adopt: the process is not running');
    }
    const entry = this.track(child, options);
    this.processes.set(entry.id, entry);
    for (const name of ['stdout', 'stderr'] as const) child[name]?.resume();
    return entry;
  }

  /** A new entry for `child`, kept up to date with its output and exit (not yet in the table). */
  private track(
    child: ChildProcess,
    options: Omit<StartOptions, 'env' | 'identity'>,
  ): ManagedProcess {
    const entry: ManagedProcess = {
      id: `${this.kind[0]}${this.nextId++}`,
      command: options.command,
      cwd: options.cwd,
      child,
      output: new OutputLog(),
      stdout: new OutputLog(STREAM_LOG_BYTES),
      stderr: new OutputLog(STREAM_LOG_BYTES),
      startedAt: new Date().toISOString(),
      exitCode: null,
      signal: null,
      timedOut: false,
    };
    for (const name of ['stdout', 'stderr'] as const) {
      // Both logs hold the same buffers (only writes small enough to merge are copied).
      child[name]?.on('data', (chunk: Buffer) => {
        entry.output.append(chunk);
        entry[name].append(chunk);
      });
    }
    // An EPIPE on a process that has exited must not crash the server.
    child.stdin?.on('error', () => {});
    const timer =
      options.timeoutMs && options.timeoutMs > 0
        ? setTimeout(() => {
            entry.timedOut = true;
            killGroup(child);
          }, options.timeoutMs)
        : undefined;
    // 'close' (not 'exit') waits for the pipes to drain, so the logs are complete when closed.
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      entry.exitCode = code;
      entry.signal = signal;
      for (const log of [entry.output, entry.stdout, entry.stderr]) log.close();
      this.retire(entry.id);
    });
    return entry;
  }

  get(id: string): ManagedProcess {
    const entry = this.processes.get(id);
    if (!entry) {
      throw new NotFoundError(
        `no ${this.kind} with id '${id}'; known: ${[...this.processes.keys()].join(', ') || '(none)'}`,
      );
    }
    return entry;
  }

  list(): ManagedProcess[] {
    return [...this.processes.values()];
  }

  /** Writes to the process's stdin; `eof` closes it afterwards. */
  write(id: string, data: string | Uint8Array, eof = false): void {
    const entry = this.get(id);
    const stdin = entry.child.stdin;
    if (entry.output.done || !stdin || stdin.writableEnded) {
      throw new BadRequestError(
        `${this.kind} ${id} no longer takes input (it exited or its input was closed)`,
      );
    }
    stdin.write(data);
    if (eof) stdin.end();
  }

  /** Signals the whole process group. */
  kill(id: string, signal: NodeJS.Signals): ManagedProcess {
    const entry = this.get(id);
    killGroup(entry.child, signal);
    return entry;
  }

  /** Forgets an entry, killing it first if it still runs. */
  remove(id: string): void {
    killGroup(this.get(id).child);
    this.processes.delete(id);
  }

  /**
   * Keeps the newest {@link FINISHED_KEPT} finished entries and forgets older ones, except those
   * whose group still has members (`cmd &`): {@link killAll} must still reach them.
   */
  private retire(id: string): void {
    this.finished.push(id);
    for (const old of [...this.finished]) {
      if (this.finished.length <= FINISHED_KEPT) return;
      const entry = this.processes.get(old);
      if (entry && groupAlive(entry.child)) continue;
      this.processes.delete(old);
      this.finished.splice(this.finished.indexOf(old), 1);
    }
  }

  /** Signals every group, including what outlived its leader (`cmd &`); used on stop. */
  killAll(signal: NodeJS.Signals = 'SIGKILL'): void {
    for (const entry of this.processes.values()) killGroup(entry.child, signal);
  }
}
