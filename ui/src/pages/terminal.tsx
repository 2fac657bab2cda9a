import { useEffect, useRef, useState } from 'preact/hooks';
import { errorText } from '../format.js';
import type { TerminalSession } from '../terminal-view.js';

/** A shell in the sandbox (xterm.js over the PTY API); closing the tab closes the session. */
export function TerminalTab({ id }: { id: string }) {
  const box = useRef<HTMLDivElement>(null);
  const [state, setState] = useState<'opening' | 'open' | 'ended'>('opening');
  const [message, setMessage] = useState<string | null>(null);
  const [generation, setGeneration] = useState(0);

  useEffect(() => {
    let session: TerminalSession | undefined;
    let stop = false;
    setState('opening');
    setMessage(null);
    import('../terminal-view.js')
      .then(({ openTerminal }) => {
        if (stop || !box.current) return undefined;
        return openTerminal(box.current, id, (text) => {
          setState('ended');
          setMessage(text);
        });
      })
      .then((opened) => {
        if (!opened) return;
        if (stop) {
          void opened.close();
          return;
        }
        session = opened;
        setState('open');
      })
      .catch((error) => {
        setState('ended');
        setMessage(`The terminal did not open: ${errorText(error)}`);
      });
    return () => {
      stop = true;
      void session?.close();
      if (box.current) box.current.replaceChildren();
    };
  }, [id, generation]);

  return (
    <section aria-labelledby="terminal-title">
      <h2 id="terminal-title">Terminal</h2>
      <p class="hint">
        A bash in the sandbox. Leaving this tab closes it and ends what runs in it.
        {state === 'opening' && ' Opening…'}
      </p>
      {message && (
        <p class="notice" role="status">
          {message}{' '}
          <button type="button" onClick={() => setGeneration((n) => n + 1)}>
            Open a new terminal
          </button>
        </p>
      )}
      <div ref={box} class="terminal" data-state={state} />
    </section>
  );
}
