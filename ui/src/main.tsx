import { type ComponentChildren, render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { loadSession, onSession, type Session, setSession, signOut } from './api.js';
import { DialogHost } from './components/dialog.js';
import { errorText } from './format.js';
import { startLive, stopLive, useLive } from './live.js';
import { KeysPage } from './pages/keys.js';
import { SandboxPage } from './pages/sandbox.js';
import { SandboxesPage } from './pages/sandboxes.js';
import { SecretsPage } from './pages/secrets.js';
import { SignIn } from './pages/signin.js';
import { TemplatesPage } from './pages/templates.js';
import { VolumesPage } from './pages/volumes.js';
import { WebhooksPage } from './pages/webhooks.js';
import { href, navigate, useRoute } from './router.js';
import './style.css';

function Nav({ session, page }: { session: Session; page: string }) {
  const live = useLive();
  const links: [string, string][] = [
    ['sandboxes', 'Sandboxes'],
    ['templates', 'Templates'],
    ['volumes', 'Volumes'],
    ['secrets', 'Secrets'],
    ['webhooks', 'Webhooks'],
    ...(session.admin ? ([['keys', 'Keys']] as [string, string][]) : []),
  ];
  return (
    <header class="top">
      <button type="button" class="skip" onClick={() => document.getElementById('main')?.focus()}>
        Skip to content
      </button>
      <span class="brand">abx</span>
      <nav aria-label="Pages">
        <ul>
          {links.map(([to, label]) => (
            <li key={to}>
              <a href={href(to)} aria-current={page === to ? 'page' : undefined}>
                {label}
              </a>
            </li>
          ))}
        </ul>
      </nav>
      <span class="who">
        <span class={live.connected ? 'dot on' : 'dot'} role="status">
          {live.connected ? 'live' : 'reconnecting'}
        </span>{' '}
        {session.name}
        {session.admin ? ' (admin)' : ''}
      </span>
      <button type="button" onClick={() => void signOut()}>
        Sign out
      </button>
    </header>
  );
}

function App() {
  const route = useRoute();
  const [session, setLocal] = useState<Session | null | undefined>(undefined);
  const [bootError, setBootError] = useState<string | null>(null);

  useEffect(() => {
    const off = onSession((next) => setLocal(next));
    loadSession()
      .then((live) => setSession(live))
      .catch((error) => setBootError(errorText(error)));
    return off;
  }, []);

  useEffect(() => {
    if (session) startLive();
    else if (session === null) stopLive();
  }, [session]);

  if (bootError) {
    return (
      <main id="main" class="signin">
        <h1>abx dashboard</h1>
        <p class="error" role="alert">
          The daemon did not answer: {bootError}
        </p>
      </main>
    );
  }
  if (session === undefined) return <p class="loading">Loading…</p>;
  const [page = 'sandboxes', ...rest] = route.parts;
  if (!session) {
    return (
      <SignIn
        error={page === 'signin' ? route.query.get('error') : null}
        onSignedIn={(next) => {
          setSession(next);
          navigate(href('sandboxes'));
        }}
      />
    );
  }
  let content: ComponentChildren;
  switch (page) {
    case 'sandboxes':
      content = rest[0] ? (
        <SandboxPage session={session} id={rest[0]} tab={rest[1] ?? 'overview'} />
      ) : (
        <SandboxesPage session={session} query={route.query} />
      );
      break;
    case 'templates':
      content = <TemplatesPage session={session} />;
      break;
    case 'volumes':
      content = <VolumesPage />;
      break;
    case 'secrets':
      content = <SecretsPage session={session} />;
      break;
    case 'webhooks':
      content = <WebhooksPage session={session} />;
      break;
    case 'keys':
      content = <KeysPage session={session} />;
      break;
    default:
      content = <SandboxesPage session={session} query={route.query} />;
  }
  return (
    <>
      <Nav session={session} page={page === 'signin' ? 'sandboxes' : page} />
      <main id="main" tabIndex={-1}>
        {content}
      </main>
      <DialogHost />
    </>
  );
}

const root = document.getElementById('app');
if (root) render(<App />, root);
