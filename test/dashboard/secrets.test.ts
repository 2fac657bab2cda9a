import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Page } from 'playwright-core';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { ApiKeys } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { apiAs, CHROMIUM, DashboardBrowser, HAS_CHROMIUM, signIn as signInAs } from './browser.js';

// The dashboard's Secrets page in a real browser (Debian's Chromium) against a real daemon: the
// value is typed into a password field and never comes back to the page.

const VALUE = 'dash-secret-value-7f3a9c';
const ROTATED = 'dash-secret-rotated-2b8e1d';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let adminKey: string;

const chrome = new DashboardBrowser();
const api = (method: string, path: string, key = adminKey) => apiAs(info.apiUrl, method, path, key);
const newPage = () => chrome.newPage();
const signIn = (page: Page, key: string) => signInAs(page, info.apiUrl, key);

beforeAll(async () => {
  if (!HAS_CHROMIUM) return;
  if (!existsSync(join(ROOT, 'dist', 'ui', 'index.html'))) {
    throw new Error('dist/ui is not built: run npm run build');
  }
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  await chrome.launch();
}, 120_000);

afterEach(() => chrome.closePages());

afterAll(async () => {
  await chrome.close();
  await abx?.close();
}, 120_000);

describe.skipIf(!HAS_CHROMIUM)(
  `the dashboard's Secrets page${HAS_CHROMIUM ? '' : ` (skipped: ${CHROMIUM} is missing)`}`,
  () => {
    test('a secret is created, updated and removed from the page; its value is never shown or sent back', async () => {
      const page = await newPage();
      await signIn(page, adminKey);
      await page.getByRole('link', { name: 'Secrets' }).click();
      await page.getByRole('heading', { name: 'Secrets', level: 1 }).waitFor();
      await page.getByLabel('Name').fill('dash-secret');
      const value = page.getByLabel('Value', { exact: true });
      expect(await value.getAttribute('type')).toBe('password');
      await value.fill(VALUE);
      await page.getByLabel(/^Metadata/).fill('team=ml, env=prod');
      await page.getByRole('button', { name: 'Create secret' }).click();
      await page.getByRole('rowheader', { name: 'dash-secret' }).waitFor();
      await page.getByText('Made secret dash-secret (version 1).').waitFor();
      // The field is emptied once sent.
      expect(await value.inputValue()).toBe('');
      const row = page.getByRole('row', { name: /dash-secret/ });
      expect(await row.textContent()).toContain('team=ml, env=prod');

      await page.getByLabel('Secret', { exact: true }).selectOption({ label: 'dash-secret' });
      await page.getByLabel(/^New value/).fill(ROTATED);
      await page.getByRole('button', { name: 'Update secret' }).click();
      await page.getByText('Updated secret dash-secret (version 2).').waitFor();
      expect((await api('GET', '/v1/secrets/dash-secret')).body).toMatchObject({
        version: 2,
        metadata: { team: 'ml', env: 'prod' },
      });

      // A bad name is refused in the server's words, and nothing is made.
      await page.getByLabel('Name').fill('sec_reserved');
      await value.fill('throwaway');
      await page.getByRole('button', { name: 'Create secret' }).click();
      await page.getByText(/does not start with sec_ \(that starts ids\)/).waitFor();
      expect(await value.inputValue()).toBe('');
      expect((await api('GET', '/v1/secrets')).body.secrets).toHaveLength(1);

      // Nothing on the page, in its storage or in any answer it received holds a value.
      const html = await page.content();
      const storage = await page.evaluate(
        () => JSON.stringify({ ...localStorage }) + JSON.stringify({ ...sessionStorage }),
      );
      for (const secret of [VALUE, ROTATED]) {
        expect(html).not.toContain(secret);
        expect(storage).not.toContain(secret);
        expect(page.bodies.join('\n')).not.toContain(secret);
      }

      await page.getByRole('button', { name: 'Remove secret dash-secret' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Remove' }).click();
      await page.getByRole('rowheader', { name: 'dash-secret' }).waitFor({ state: 'detached' });
      expect((await api('GET', '/v1/secrets')).body.secrets).toEqual([]);
      expect(await page.evaluate('window.__csp')).toEqual([]);
      expect(page.errors).toEqual([]);
    });

    test("a key that is not an admin sees its own secrets only; an admin sees every key's with its owner", async () => {
      const made = await ApiKeys.create('dash-secrets-alice', { home: abx.home });
      const created = await request(`${info.apiUrl}/v1/secrets`, {
        method: 'POST',
        headers: { authorization: `Bearer ${made.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'alices', value: 'alice-only' }),
      });
      expect(created.statusCode).toBe(201);
      await created.body.text();
      const admin = await newPage();
      await signIn(admin, adminKey);
      await admin.getByRole('link', { name: 'Secrets' }).click();
      const row = admin.getByRole('row', { name: /alices/ });
      await row.waitFor();
      expect(await row.textContent()).toContain(made.id);

      const bob = await ApiKeys.create('dash-secrets-bob', { home: abx.home });
      const page = await newPage();
      await signIn(page, bob.key);
      await page.getByRole('link', { name: 'Secrets' }).click();
      await page.getByText('No secret yet.').waitFor();
      expect(await page.getByRole('rowheader', { name: 'alices' }).count()).toBe(0);
    });
  },
);
