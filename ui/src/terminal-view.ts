/**
 * xterm.js over envd's TERMINAL routes, loaded only when a terminal opens (a dynamic import).
 * Everything the sandbox prints goes to `terminal.write`, never into the page's DOM as HTML.
 */
import { FitAddon } from '@xterm/addon-fit';
import { Terminal } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';
import { sandboxFetch, sandboxJson } from './gateway.js';

/** The longest envd lets a read wait for output. */
const LONG_POLL_MS = 25_000;

export interface TerminalSession {
  /** Closes the session in the sandbox (killing what runs in it) and the view. */
  close(): Promise<void>;
  focus(): void;
}

interface ReadWire {
  data: string;
  offset: number;
  next_offset: number;
  done: boolean;
  exit_code?: number | null;
}

export async function openTerminal(
  element: HTMLElement,
  sandboxId: string,
  onEnd: (message: string) => void,
): Promise<TerminalSession> {
  const term = new Terminal({
    cursorBlink: true,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    fontSize: 14,
    // Room below the baseline, so underscores are not cut off.
    lineHeight: 1.15,
    scrollback: 5000,
    theme: { background: '#1e1e1e', foreground: '#e6e6e6' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(element);
  fit.fit();
  const aborter = new AbortController();
  const { id } = await sandboxJson<{ id: string }>(sandboxId, 'POST', '/terminal', {
    body: { cols: term.cols, rows: term.rows },
  });
  const path = `/terminal/${encodeURIComponent(id)}`;
  let closed = false;

  // Keystrokes in order: one write in flight, what is typed meanwhile goes in the next.
  let pending = '';
  let writing = false;
  const flush = async () => {
    if (writing || closed) return;
    writing = true;
    while (pending && !closed) {
      const data = pending;
      pending = '';
      try {
        await sandboxJson(sandboxId, 'POST', `${path}/write`, { body: { data } });
      } catch (error) {
        term.write(`\r\n[could not type into the terminal: ${(error as Error).message}]\r\n`);
      }
    }
    writing = false;
  };
  const typed = term.onData((data) => {
    pending += data;
    void flush();
  });

  let sized = `${term.cols}x${term.rows}`;
  const resized = term.onResize(({ cols, rows }) => {
    if (`${cols}x${rows}` === sized || closed) return;
    sized = `${cols}x${rows}`;
    void sandboxJson(sandboxId, 'POST', `${path}/resize`, { body: { cols, rows } }).catch(() => {});
  });
  const observer = new ResizeObserver(() => {
    try {
      fit.fit();
    } catch {
      // not laid out (hidden): the next resize fits it
    }
  });
  observer.observe(element);

  const follow = async () => {
    let offset = 0;
    let failures = 0;
    while (!closed) {
      try {
        const chunk = await sandboxJson<ReadWire>(sandboxId, 'GET', `${path}/read`, {
          query: { offset, wait_ms: LONG_POLL_MS },
          signal: aborter.signal,
        });
        failures = 0;
        if (chunk.data) term.write(chunk.data);
        if (chunk.done && chunk.next_offset === offset) {
          onEnd(
            `The shell ended${chunk.exit_code == null ? '' : ` (exit code ${chunk.exit_code})`}.`,
          );
          return;
        }
        offset = chunk.next_offset;
      } catch (error) {
        if (closed) return;
        if (++failures >= 3) {
          onEnd(`The terminal stopped: ${(error as Error).message}`);
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    }
  };
  void follow();
  term.focus();

  return {
    focus: () => term.focus(),
    async close() {
      if (closed) return;
      closed = true;
      aborter.abort();
      observer.disconnect();
      typed.dispose();
      resized.dispose();
      term.dispose();
      await sandboxFetch(sandboxId, 'DELETE', path).catch(() => undefined);
    },
  };
}
