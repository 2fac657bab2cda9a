import type { ChildProcess } from 'node:child_process';
import { killGroup, spawnFailure, spawnGroup } from './child-process.js';
import { BadRequestError, NotFoundError } from './errors.js';
import { OutputLog } from './output-log.js';

/** A background process (or terminal) the server started and keeps track of. */
export interface ManagedProcess {
  id: string;
  command: string;
  cwd: string;
  child: ChildProcess;
  /** stdout and stderr interleaved, as they arrived. */
  output: OutputLog;
  startedAt: string;
  exitCode: number | null;
  signal: NodeJS.Signals | null;
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
  private nextId = 1;

  /** `kind` names the entries in error messages: `process`, `terminal`. */
  constructor(private readonly kind: string) {}

  start(
    file: string,
    args: readonly string[],
    options: { command: string; cwd: string; env?: Record<string, string> },
  ): Promise<ManagedProcess> {
    const child = spawnGroup(file, args, options);
    const entry: ManagedProcess = {
      id: `${this.kind[0]}${this.nextId++}`,
      command: options.command,
      cwd: options.cwd,
      child,
      output: new OutputLog(),
      startedAt: new Date().toISOString(),
      exitCode: null,
      signal: null,
    };
    child.stdout?.on('data', (chunk: Buffer) => entry.output.append(chunk));
    child.stderr?.on('data', (chunk: Buffer) => entry.output.append(chunk));
    // An EPIPE on a process that has exited must not crash the server.
    child.stdin?.on('error', () => {});
    child.once('close', (code, signal) => {
      entry.exitCode = code;
      entry.signal = signal;
      entry.output.close();
    });
    return new Promise((resolve, reject) => {
      child.once('spawn', () => {
        this.processes.set(entry.id, entry);
        resolve(entry);
      });
      child.once('error', (error) => reject(spawnFailure(error, file, options.cwd)));
    });
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
  write(id: string, data: string, eof = false): void {
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

  /** Signals every group, including what outlived its leader (`cmd &`); used on stop. */
  killAll(signal: NodeJS.Signals = 'SIGKILL'): void {
    for (const entry of this.processes.values()) killGroup(entry.child, signal);
  }
}
