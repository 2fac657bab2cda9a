import { existsSync } from 'node:fs';
import { type Browser, type BrowserContext, chromium, type Page } from 'playwright-core';
import { request } from 'undici';

/** Debian's Chromium: the dashboard's page tests skip, saying so, where it is missing. */
export const CHROMIUM = '/usr/bin/chromium';
export const HAS_CHROMIUM = existsSync(CHROMIUM);

/** A page that records every response body and uncaught error (each CSP violation in `__csp`). */
export type RecordingPage = Page & { bodies: string[]; errors: string[] };

/** A headless Chromium for a test file: a fresh profile per page, each closed after its test. */
export class DashboardBrowser {
  private browser: Browser | undefined;
  private readonly contexts: BrowserContext[] = [];

  async launch(): Promise<void> {
    this.browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
    });
  }

  async newPage(viewport = { width: 1280, height: 860 }): Promise<RecordingPage> {
    if (!this.browser) throw new Error('the browser was not launched (beforeAll)');
    const context = await this.browser.newContext({ viewport });
    this.contexts.push(context);
    await context.addInitScript({
      content: `window.__csp = [];
      document.addEventListener('securitypolicyviolation', (event) => {
        window.__csp.push(event.violatedDirective + ' ' + event.blockedURI);
      });`,
    });
    const page = (await context.newPage()) as RecordingPage;
    page.bodies = [];
    page.errors = [];
    page.on('pageerror', (error) => page.errors.push(error.message));
    page.on('response', (response) => {
      void response
        .text()
        .then((text) => page.bodies.push(text))
        .catch(() => undefined);
    });
    return page;
  }

  /** Closes the pages a test opened (afterEach). */
  async closePages(): Promise<void> {
    for (const context of this.contexts.splice(0)) await context.close().catch(() => undefined);
  }

  async close(): Promise<void> {
    await this.browser?.close().catch(() => undefined);
  }
}

/** Signs in with a pasted key and waits for the first page (Sandboxes). */
export async function signIn(page: Page, apiUrl: string, key: string): Promise<void> {
  await page.goto(`${apiUrl}/`);
  await page.getByLabel('API key').fill(key);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Sandboxes', level: 1 }).waitFor();
}

/** A call of the daemon's API with `key`: the status and the parsed body. */
export async function apiAs(apiUrl: string, method: string, path: string, key: string) {
  const response = await request(`${apiUrl}${path}`, {
    method: method as 'GET',
    headers: { authorization: `Bearer ${key}` },
  });
  const text = await response.body.text();
  return { status: response.statusCode, body: text ? JSON.parse(text) : undefined };
}
