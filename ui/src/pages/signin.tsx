import { useState } from 'preact/hooks';
import { type Session, signIn } from '../api.js';
import { Failure } from '../components/table.js';
import { errorText } from '../format.js';

/** Sign-in: paste an API key (the link flow arrives signed in, or here with ?error=link). */
export function SignIn({
  error,
  onSignedIn,
}: {
  error?: string | null;
  onSignedIn(s: Session): void;
}) {
  const [key, setKey] = useState('');
  const [failure, setFailure] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setFailure(null);
    try {
      const session = await signIn(key.trim());
      // The key is not kept: only the HttpOnly cookie the answer set.
      setKey('');
      onSignedIn(session);
    } catch (err) {
      setFailure(errorText(err).replace(/^POST \/ui\/signin: /, ''));
    } finally {
      setBusy(false);
    }
  };

  return (
    <main class="signin" id="main">
      <h1>abx dashboard</h1>
      {error && (
        <p class="error" role="alert">
          {error === 'link' ? (
            <>
              That sign-in link was used already or has expired. Run <code>abx dashboard</code>{' '}
              again for a new one, or paste an API key below.
            </>
          ) : (
            'Sign-in failed. Paste an API key below.'
          )}
        </p>
      )}
      <form onSubmit={submit}>
        <label for="api-key">API key</label>
        <input
          id="api-key"
          name="key"
          type="password"
          autocomplete="off"
          spellcheck={false}
          placeholder="abx_…"
          required
          value={key}
          onInput={(e) => setKey((e.target as HTMLInputElement).value)}
        />
        <button type="submit" class="primary" disabled={busy}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
        <Failure text={failure} />
      </form>
      <p class="hint">
        Or run <code>abx dashboard</code>: it opens this page with a one-time sign-in link. The
        session is a cookie that scripts cannot read; the key is not kept by the page.
      </p>
    </main>
  );
}
