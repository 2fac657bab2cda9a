import { existsSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { ApiKeys } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { verifyWebhook } from '../../src/util/webhook-signature.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { apiAs, CHROMIUM, DashboardBrowser, HAS_CHROMIUM, signIn as signInAs } from './browser.js';

// The dashboard's Webhooks page in a real browser (Debian's Chromium) against a real daemon and
// a receiver on loopback: add (the generated secret shown once), test-send, the delivery log,
// redeliver, disable, remove; another key sees none of it.

const ENV = { ABX_WEBHOOK_PERMIT: '127.0.0.0/8', ABX_WEBHOOK_POLL_MS: '50' };
const saved: Record<string, string | undefined> = {};

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let server: Server;
let port = 0;
let answer = 200;
const got: { headers: IncomingMessage['headers']; body: string }[] = [];

const chrome = new DashboardBrowser();
const api = (method: string, path: string, key: string) => apiAs(info.apiUrl, method, path, key);
const newPage = () => chrome.newPage({ width: 1400, height: 900 });

/** Signs in and opens the Webhooks page. */
async function signIn(page: Page, key: string): Promise<void> {
  await signInAs(page, info.apiUrl, key);
  await page.getByRole('link', { name: 'Webhooks' }).click();
  await page.getByRole('heading', { name: 'Webhooks', level: 1 }).waitFor();
}

beforeAll(async () => {
  if (!HAS_CHROMIUM) return;
  if (!existsSync(join(ROOT, 'dist', 'ui', 'index.html'))) {
    throw new Error('dist/ui is not built: run npm run build');
  }
  for (const [name, value] of Object.entries(ENV)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      got.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
      res.writeHead(answer).end(answer === 200 ? 'ok' : 'not today');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as AddressInfo).port;
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  await chrome.launch();
}, 120_000);

afterEach(() => chrome.closePages());

afterAll(async () => {
  await chrome.close();
  await abx?.close();
  server?.closeAllConnections();
  await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  for (const [name, value] of Object.entries(saved)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
}, 120_000);

describe.skipIf(!HAS_CHROMIUM)(
  `the dashboard's Webhooks page${HAS_CHROMIUM ? '' : ` (skipped: ${CHROMIUM} is missing)`}`,
  () => {
    test('a webhook is added (its secret shown once), tested, redelivered from its log, disabled and removed; another key sees none of it', async () => {
      const alice = await ApiKeys.create('dash-hooks-alice', { home: abx.home });
      const page = await newPage();
      await signIn(page, alice.key);
      await page.getByText('No webhook yet.').waitFor();

      // Add: the secret abx makes is shown once, then never again.
      await page.getByLabel('URL', { exact: true }).fill(`http://127.0.0.1:${port}/hook`);
      await page.getByLabel(/^Name/).fill('dash-hook');
      await page.getByRole('button', { name: 'Add webhook' }).click();
      const shown = page.getByLabel('Signing secret', { exact: true });
      await shown.waitFor();
      const secret = await shown.inputValue();
      expect(secret).toMatch(/^whsec_/);
      const row = page.getByRole('row', { name: /dash-hook/ });
      expect(await row.textContent()).toContain(`http://127.0.0.1:${port}/hook`);
      expect(await row.textContent()).toContain('all');
      await page.getByRole('button', { name: 'Done' }).click();
      await shown.waitFor({ state: 'detached' });
      const bodiesAtCreate = page.bodies.length;

      // Test: the receiver gets one webhook.test event, signed with that secret; the log says so.
      await page.getByRole('button', { name: 'Send webhook dash-hook a test event' }).click();
      await page.getByRole('heading', { name: 'Deliveries of dash-hook' }).waitFor();
      const log = page.getByRole('region', { name: 'Deliveries of dash-hook' }).getByRole('row');
      await log.filter({ hasText: /test event.*delivered \(HTTP 200\)/ }).waitFor();
      expect(got).toHaveLength(1);
      const first = verifyWebhook(secret, got[0]?.headers ?? {}, got[0]?.body ?? '');
      expect(first.payload).toMatchObject({ type: 'webhook.test' });
      expect(await row.textContent()).toContain('delivered (HTTP 200)');

      // A refusing receiver: the test fails, said in the log with the receiver's answer;
      // redelivered once it accepts, with the same delivery id.
      answer = 500;
      await page.getByRole('button', { name: 'Send webhook dash-hook a test event' }).click();
      const failed = log.filter({ hasText: /failed \(HTTP 500\)/ });
      await failed.waitFor();
      expect(await failed.textContent()).toContain('the receiver answered 500: not today');
      answer = 200;
      const failedId = got[1]?.headers['abx-webhook-id'] as string;
      await page.getByRole('button', { name: `Redeliver ${failedId}` }).click();
      await log.filter({ hasText: failedId }).filter({ hasText: 'delivered (HTTP 200)' }).waitFor();
      expect(got.map((g) => g.headers['abx-webhook-id'])).toEqual([
        first.deliveryId,
        failedId,
        failedId,
      ]);

      // Disable: the row says so and Test is not offered; enable again.
      await page.getByRole('button', { name: 'Disable webhook dash-hook' }).click();
      await page.getByText('Disabled webhook dash-hook.').waitFor();
      expect(
        await page
          .getByRole('button', { name: 'Send webhook dash-hook a test event' })
          .isDisabled(),
      ).toBe(true);
      const hooks = (await api('GET', '/v1/webhooks', alice.key)).body.webhooks;
      expect(hooks.map((h: { enabled: boolean }) => h.enabled)).toEqual([false]);
      await page.getByRole('button', { name: 'Enable webhook dash-hook' }).click();
      await page.getByText('Enabled webhook dash-hook.').waitFor();

      // A bad URL is refused in the daemon's words, and nothing is added.
      await page.getByLabel('URL', { exact: true }).fill('http://169.254.169.254/latest');
      await page.getByRole('button', { name: 'Add webhook' }).click();
      await page.getByRole('alert').waitFor();
      expect(await page.getByRole('alert').textContent()).toMatch(/169\.254\.169\.254/);
      expect((await api('GET', '/v1/webhooks', alice.key)).body.webhooks).toHaveLength(1);

      // The secret is in no answer after the create's, in no storage, not on the page.
      await page.reload();
      await page.getByRole('heading', { name: 'Webhooks', level: 1 }).waitFor();
      await page.getByRole('row', { name: /dash-hook/ }).waitFor();
      expect(await page.content()).not.toContain(secret);
      expect(page.bodies.slice(bodiesAtCreate).join('\n')).not.toContain(secret);
      const storage = await page.evaluate(
        () => JSON.stringify({ ...localStorage }) + JSON.stringify({ ...sessionStorage }),
      );
      expect(storage).not.toContain(secret);

      // Another key sees none of it.
      const bob = await ApiKeys.create('dash-hooks-bob', { home: abx.home });
      const other = await newPage();
      await signIn(other, bob.key);
      await other.getByText('No webhook yet.').waitFor();

      // Remove, asked first.
      await page.getByRole('button', { name: 'Remove webhook dash-hook' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Remove' }).click();
      await page.getByText('No webhook yet.').waitFor();
      expect((await api('GET', '/v1/webhooks', alice.key)).body.webhooks).toEqual([]);
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(got).toHaveLength(3);
      expect(await page.evaluate('window.__csp')).toEqual([]);
      expect(page.errors).toEqual([]);
    }, 90_000);
  },
);
