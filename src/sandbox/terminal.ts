import { ENVD_PORT } from '../../runtime/protocol/constants.js';
import type { HttpClient } from './http-client.js';
import type { Sandbox } from './sandbox.js';

/** Options of {@link Terminal.open}. */
export interface TerminalOpenOptions {
  /** What runs in the pty; default an interactive bash. */
  command?: string;
  /** Size of the pty; default 80×24. */
  cols?: number;
  rows?: number;
  /** Working directory; default the template's workdir. */
  cwd?: string;
  /** Extra environment variables of the session. */
  envs?: Record<string, string>;
}

/** A piece of a terminal's screen output. */
export interface TerminalOutput {
  /** The output from byte `offset` on (the pty's bytes as UTF-8). */
  data: string;
  offset: number;
  /** Where the next read starts. */
  nextOffset: number;
  /** The session has ended: no output will follow. */
  done: boolean;
  /** The shell's exit code once it has ended (`null` while it runs, or when a signal ended it). */
  exitCode: number | null;
}

interface ReadWire {
  data: string;
  offset: number;
  next_offset: number;
  done: boolean;
  exit_code?: number | null;
}

/** The longest envd lets a read wait for output; our request deadline must exceed it. */
const LONG_POLL_MS = 25_000;

/**
 * An interactive pty session in a sandbox (envd's TERMINAL routes: util-linux `script` allocates
 * the pty). Type into it with {@link write}, follow its screen with {@link output}, resize it,
 * close it.
 *
 * @example
 * const term = await Terminal.open(sandbox, { cols: 120, rows: 40 });
 * await term.write('echo hi; exit\n');
 * for await (const chunk of term.output()) process.stdout.write(chunk);
 */
export class Terminal {
  private constructor(
    private readonly envd: HttpClient,
    /** envd's id of the session. */
    readonly id: string,
  ) {}

  /** Opens a session running `command` (default `bash -i`) in a new pty. */
  static async open(sandbox: Sandbox, options: TerminalOpenOptions = {}): Promise<Terminal> {
    const envd = sandbox.portClient(ENVD_PORT, LONG_POLL_MS + 15_000);
    const { id } = await envd.json<{ id: string }>('POST', '/terminal', {
      body: {
        ...(options.command === undefined ? {} : { command: options.command }),
        ...(options.cols === undefined ? {} : { cols: options.cols }),
        ...(options.rows === undefined ? {} : { rows: options.rows }),
        ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
        ...(options.envs === undefined ? {} : { env: options.envs }),
      },
    });
    return new Terminal(envd, id);
  }

  /** Types `data` into the terminal (keystrokes, as a user would: "\n" submits a line). */
  async write(data: string): Promise<void> {
    await this.envd.json('POST', `/terminal/${this.id}/write`, { body: { data } });
  }

  /** Changes the pty size; the program in it gets SIGWINCH. */
  async resize(cols: number, rows: number): Promise<void> {
    await this.envd.json('POST', `/terminal/${this.id}/resize`, { body: { cols, rows } });
  }

  /** Output from byte `offset` on, waiting up to `waitMs` (≤ 25 s) for some to arrive. */
  async read(offset = 0, waitMs = 0): Promise<TerminalOutput> {
    const wire = await this.envd.json<ReadWire>('GET', `/terminal/${this.id}/read`, {
      query: { offset, wait_ms: Math.min(Math.max(0, waitMs), LONG_POLL_MS) },
    });
    return {
      data: wire.data,
      offset: wire.offset,
      nextOffset: wire.next_offset,
      done: wire.done,
      exitCode: wire.exit_code ?? null,
    };
  }

  /**
   * The screen output as it comes, from `offset` on, until the session ends (long polls, so
   * nothing is missed between two reads).
   */
  async *output(offset = 0): AsyncGenerator<string> {
    let next = offset;
    for (;;) {
      const chunk = await this.read(next, LONG_POLL_MS);
      if (chunk.data) yield chunk.data;
      if (chunk.done) this.exitCode = chunk.exitCode;
      if (chunk.done && chunk.nextOffset === next) return;
      next = chunk.nextOffset;
    }
  }

  /** The shell's exit code, once {@link output} has seen the session end. */
  exitCode: number | null = null;

  /** Closes the session, killing everything running in it; an ended session is fine. */
  async close(): Promise<void> {
    await this.envd.json('DELETE', `/terminal/${this.id}`).catch(() => undefined);
  }
}
