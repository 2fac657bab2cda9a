import { execFileSync } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  type Browser,
  type BrowserContext,
  chromium,
  type Page,
  type Response,
} from 'playwright-core';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { ApiKeys, commandRegistry, Sandbox, Templates } from '../../src/index.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { SERVER_E2E_TEMPLATE } from '../helpers/server-e2e.js';

// The dashboard (issue 30) in a real browser: Debian's Chromium driven by playwright-core, against
// a real daemon serving dist/ui and real sandboxes. Every page is photographed into
// test/dashboard/screenshots/ for a reviewer; ABX_UPDATE_DOCS_IMAGES=1 also copies the sandboxes
// page and the terminal to docs/images/.

const CHROMIUM = '/usr/bin/chromium';
const HAS_CHROMIUM = existsSync(CHROMIUM);
const SHOTS = join(ROOT, 'test', 'dashboard', 'screenshots');
/** What a page must never run, however it arrives: each payload sets `window.__xss`. */
const XSS = (n: number) => `<img src=x onerror=window.__xss=${n}>`;

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
let info: DaemonInfo;
let adminKey: string;
let browser: Browser;
/** Contexts and sandboxes a test opened: closed after it, also when it fails. */
const contexts: BrowserContext[] = [];
const sandboxes: Sandbox[] = [];

async function api(method: string, path: string, body?: unknown, key = adminKey) {
  const response = await request(`${info.apiUrl}${path}`, {
    method: method as 'POST',
    headers: {
      authorization: `Bearer ${key}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await response.body.text();
  return { status: response.statusCode, body: text ? JSON.parse(text) : undefined };
}

/**
 * A fresh browser profile (no cookies) with a page that records Content-Security-Policy
 * violations and script errors, so a test can show the page ran under its CSP untouched.
 */
async function newPage(): Promise<Page> {
  const context = await browser.newContext({
    viewport: { width: 1280, height: 860 },
    acceptDownloads: true,
  });
  contexts.push(context);
  // Page code as text: this file is compiled without the DOM's types.
  await context.addInitScript({
    content: `window.__csp = [];
      document.addEventListener('securitypolicyviolation', (event) => {
        window.__csp.push(event.violatedDirective + ' ' + event.blockedURI);
      });`,
  });
  const page = await context.newPage();
  const errors: string[] = [];
  page.on('pageerror', (error) => errors.push(error.message));
  (page as Page & { errors: string[] }).errors = errors;
  return page;
}

/** Nothing the CSP refused, no script error, and no payload ran. */
async function expectClean(page: Page): Promise<void> {
  expect(await page.evaluate('window.__csp')).toEqual([]);
  expect(await page.evaluate('window.__xss')).toBeUndefined();
  expect((page as Page & { errors: string[] }).errors).toEqual([]);
}

async function shoot(page: Page, name: string): Promise<void> {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

/** Signs in by pasting `key` on the sign-in page. */
async function signInWithKey(page: Page, key: string): Promise<void> {
  await page.goto(`${info.apiUrl}/`);
  await page.getByLabel('API key').fill(key);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Sandboxes', level: 1 }).waitFor();
}

async function created(options: Parameters<typeof Sandbox.create>[0] = {}): Promise<Sandbox> {
  const sandbox = await Sandbox.create({ home, ...options });
  sandboxes.push(sandbox);
  return sandbox;
}

function row(page: Page, id: string) {
  return page.locator(`tr[data-sandbox-id="${id}"]`);
}

/** The terminal's screen as text, a line per row (xterm's DOM renderer: a div per row). */
async function screenText(page: Page): Promise<string> {
  const rows = await page.locator('.xterm-rows > div').allTextContents();
  return rows.map((text) => text.replace(/\u00a0/g, ' ')).join('\n');
}

/** Types a line into the terminal and waits until `expected` shows on its screen. */
async function typeLine(page: Page, line: string, expected: RegExp): Promise<RegExpMatchArray> {
  await page.keyboard.type(`${line}\n`);
  let match: RegExpMatchArray | null = null;
  await expect
    .poll(
      async () => {
        match = (await screenText(page)).match(expected);
        return match !== null;
      },
      { timeout: 15_000 },
    )
    .toBe(true);
  return match as unknown as RegExpMatchArray;
}

beforeAll(async () => {
  if (!HAS_CHROMIUM) return;
  mkdirSync(SHOTS, { recursive: true });
  // Samples every second, so the list's charts fill within a test (the daemon inherits it).
  process.env.ABX_METRICS_INTERVAL_MS = '1000';
  abx = await createAbxHome();
  home = abx.home;
  // Running one test file by hand: the UI may not be built yet.
  if (!existsSync(join(ROOT, 'dist', 'ui', 'index.html'))) {
    execFileSync('npx', ['vite', 'build', '--config', 'ui/vite.config.ts'], {
      cwd: ROOT,
      stdio: 'pipe',
    });
  }
  await Sandbox.list({ home });
  info = JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo;
  adminKey = readFileSync(join(home, 'api-key'), 'utf8').trim();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}, 300_000);

afterEach(async () => {
  for (const context of contexts.splice(0)) await context.close().catch(() => undefined);
  for (const sandbox of sandboxes.splice(0)) await sandbox.kill().catch(() => undefined);
});

afterAll(async () => {
  delete process.env.ABX_METRICS_INTERVAL_MS;
  await browser?.close().catch(() => undefined);
  await removeTemplates(home);
  await abx?.close();
});

describe.skipIf(!HAS_CHROMIUM)(
  `the dashboard in a real browser${HAS_CHROMIUM ? '' : ` (skipped: ${CHROMIUM} is missing; scripts/setup-system.sh installs Debian's chromium)`}`,
  () => {
    test('signs in with a one-time link; a used link sends the page back to sign-in saying so', async () => {
      const link = await api('POST', '/ui/links');
      expect(link.status).toBe(201);
      const page = await newPage();
      await page.goto(link.body.url);
      await page.getByRole('heading', { name: 'Sandboxes', level: 1 }).waitFor();
      // The code does not stay in the address bar, and the session is not readable by scripts.
      expect(page.url()).not.toContain('code=');
      expect(await page.evaluate('document.cookie')).toBe('');
      await page.locator('header.top').getByText('(admin)').waitFor();

      const again = await newPage();
      await again.goto(link.body.url);
      await again
        .getByRole('alert')
        .getByText(/used already or has expired/)
        .waitFor();
      await again.getByLabel('API key').waitFor();
      await shoot(again, 'signin-link-used');
      await expectClean(page);
      await expectClean(again);
    });

    test('signs in with a pasted key, which the page does not keep; a wrong key is refused in the server’s words', async () => {
      const page = await newPage();
      await page.goto(`${info.apiUrl}/`);
      await shoot(page, 'signin');
      await page.getByLabel('API key').fill('abx_not-a-key');
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.getByRole('alert').waitFor();
      expect(await page.getByRole('alert').textContent()).not.toBe('');
      await page.getByLabel('API key').fill(adminKey);
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.getByRole('heading', { name: 'Sandboxes', level: 1 }).waitFor();
      expect(page.url()).not.toContain(adminKey);
      expect(await page.content()).not.toContain(adminKey);
      const stored = (await page.evaluate(
        '[document.cookie, JSON.stringify({ ...localStorage }), JSON.stringify({ ...sessionStorage })]',
      )) as string[];
      expect(stored.join(' ')).not.toContain(adminKey);
      expect(stored[0]).toBe('');

      // Signing out ends the session: a reload shows the sign-in page.
      await page.getByRole('button', { name: 'Sign out' }).click();
      await page.getByLabel('API key').waitFor();
      await page.reload();
      await page.getByLabel('API key').waitFor();
      await expectClean(page);
    });

    test('a sandbox created by the SDK appears within 2 s with its metadata as text, and goes when killed', async () => {
      const page = await newPage();
      const loads: Response[] = [];
      page.on('response', (response) => loads.push(response));
      await signInWithKey(page, adminKey);

      // The first load's JavaScript (the sandboxes page), and no terminal or chart code in it.
      const scripts = loads.filter((r) => r.url().endsWith('.js'));
      const sizes = await Promise.all(
        scripts.map(async (r) => ({
          file: new URL(r.url()).pathname,
          bytes: (await r.request().sizes()).responseBodySize,
        })),
      );
      writeFileSync(join(SHOTS, 'page-weight.json'), `${JSON.stringify(sizes, null, 2)}\n`);
      expect(sizes.length).toBeGreaterThan(0);
      expect(sizes.map((s) => s.file).join(' ')).not.toMatch(/terminal|charts/);

      const sandbox = await created({ metadata: { suite: 'dashboard', note: XSS(1) } });
      await row(page, sandbox.sandboxId).waitFor({ timeout: 2_000 });
      const cells = row(page, sandbox.sandboxId);
      await cells.getByText(`note=${XSS(1)}`).waitFor();
      await cells.getByText('suite=dashboard').waitFor();
      expect(await cells.locator('img').count()).toBe(0);

      // Filtering by metadata keeps it; another value hides it.
      await page.getByLabel('Metadata').fill('suite=dashboard');
      await row(page, sandbox.sandboxId).waitFor();
      await page.getByLabel('Metadata').fill('suite=other');
      await row(page, sandbox.sandboxId).waitFor({ state: 'detached' });
      await page.getByLabel('Metadata').fill('');
      await page.getByLabel('State').selectOption('paused');
      await row(page, sandbox.sandboxId).waitFor({ state: 'detached' });
      await page.getByLabel('State').selectOption('running');
      await row(page, sandbox.sandboxId).waitFor();

      await sandbox.kill();
      await row(page, sandbox.sandboxId).waitFor({ state: 'detached', timeout: 10_000 });
      await expectClean(page);
    });

    test('each row charts its sandbox’s CPU and memory from the live metrics', async () => {
      const busy = await created({ metadata: { agent: 'planner', task: 'build-index' } });
      await created({ metadata: { agent: 'coder', task: 'fix-tests' } });
      await created({ metadata: { agent: 'reviewer' } });
      // A few seconds of work, so one chart has something to show.
      const work = await busy.commands.start('timeout 6 sh -c "while :; do :; done"');
      const page = await newPage();
      await signInWithKey(page, adminKey);
      for (const sandbox of sandboxes) {
        // Two samples or more make a line (the daemon here samples every second). An idle
        // sandbox's CPU line is flat (no height: not "visible" to Playwright): its points count.
        await expect
          .poll(
            async () => {
              const line = row(page, sandbox.sandboxId).locator('svg.spark polyline').first();
              if ((await line.count()) === 0) return 0;
              return ((await line.getAttribute('points')) ?? '').trim().split(/\s+/).length;
            },
            { timeout: 20_000 },
          )
          .toBeGreaterThanOrEqual(2);
        expect(
          await row(page, sandbox.sandboxId).locator('td.metric').first().textContent(),
        ).toMatch(/\d%/);
      }
      await shoot(page, 'sandboxes');
      if (process.env.ABX_UPDATE_DOCS_IMAGES === '1') {
        copyFileSync(
          join(SHOTS, 'sandboxes.png'),
          join(ROOT, 'docs', 'images', 'dashboard-sandboxes.png'),
        );
      }
      await work.wait().catch(() => undefined);
      await expectClean(page);
    }, 60_000);

    test('pause, resume, extend and kill from the page, the destructive one confirmed first', async () => {
      const sandbox = await created({ timeoutMs: 600_000 });
      const page = await newPage();
      await signInWithKey(page, adminKey);
      const id = sandbox.sandboxId;
      await row(page, id)
        .getByRole('button', { name: `Pause ${id}` })
        .click();
      await row(page, id).getByText('paused').waitFor({ timeout: 15_000 });
      expect((await sandbox.getInfo()).state).toBe('paused');
      await row(page, id)
        .getByRole('button', { name: `Resume ${id}` })
        .click();
      await row(page, id).getByText('running').waitFor({ timeout: 15_000 });
      expect((await sandbox.getInfo()).state).toBe('running');

      await row(page, id)
        .getByRole('button', { name: `Extend the timeout of ${id}` })
        .click();
      const extend = page.getByRole('dialog');
      await extend.getByLabel('Minutes left from now').fill('120');
      await extend.getByRole('button', { name: 'Set timeout' }).click();
      await extend.waitFor({ state: 'hidden' });
      const left = Date.parse((await sandbox.getInfo()).expiresAt) - Date.now();
      expect(left).toBeGreaterThan(100 * 60_000);

      await sandbox.files.write('saved.txt', 'kept by the snapshot');
      await row(page, id)
        .getByRole('button', { name: `Snapshot ${id}` })
        .click();
      const snapshot = page.getByRole('dialog');
      await snapshot.getByLabel('Template name').fill('dash-snapshot');
      await snapshot.getByRole('button', { name: 'Save snapshot' }).click();
      await snapshot.waitFor({ state: 'hidden', timeout: 60_000 });
      const fromSnapshot = await created({ template: 'dash-snapshot' });
      expect(await fromSnapshot.files.read('saved.txt')).toBe('kept by the snapshot');

      await row(page, id)
        .getByRole('button', { name: `Kill ${id}` })
        .click();
      const confirm = page.getByRole('dialog');
      await confirm.getByText(`Kill sandbox ${id}?`).waitFor();
      await shoot(page, 'sandboxes-kill-confirm');
      // Cancel keeps it.
      await confirm.getByRole('button', { name: 'Cancel' }).click();
      expect((await sandbox.getInfo()).state).toBe('running');
      await row(page, id)
        .getByRole('button', { name: `Kill ${id}` })
        .click();
      await page.getByRole('dialog').getByRole('button', { name: 'Kill' }).click();
      await row(page, id).waitFor({ state: 'detached', timeout: 10_000 });
      expect((await Sandbox.list({ home, all: true })).find((s) => s.sandboxId === id)?.state).toBe(
        'killed',
      );
      await expectClean(page);
    }, 120_000);

    test('works from the keyboard alone: sign-in, a row’s kill dialog, Escape, the focus shown', async () => {
      const sandbox = await created();
      const page = await newPage();
      await page.goto(`${info.apiUrl}/`);
      // The form is drawn once the page has asked for its session.
      await page.getByLabel('API key').waitFor();
      await page.keyboard.press('Tab');
      expect(await page.evaluate('document.activeElement.id')).toBe('api-key');
      await page.keyboard.type(adminKey);
      await page.keyboard.press('Enter');
      await row(page, sandbox.sandboxId).waitFor();
      // Tab through the page until the row's Kill button has the focus; the first stop skips to
      // the content.
      const kill = `Kill ${sandbox.sandboxId}`;
      await page.keyboard.press('Tab');
      expect(await page.evaluate('document.activeElement.textContent')).toBe('Skip to content');
      for (let i = 0; i < 40; i++) {
        await page.keyboard.press('Tab');
        if ((await page.evaluate('document.activeElement.getAttribute("aria-label")')) === kill) {
          break;
        }
      }
      expect(await page.evaluate('document.activeElement.getAttribute("aria-label")')).toBe(kill);
      // The focus is visible: a real outline on the focused button.
      expect(await page.evaluate('getComputedStyle(document.activeElement).outlineStyle')).not.toBe(
        'none',
      );
      await page.keyboard.press('Enter');
      const dialog = page.getByRole('dialog');
      await dialog.getByText(`Kill sandbox ${sandbox.sandboxId}?`).waitFor();
      expect(await page.evaluate('!!document.activeElement.closest("dialog")')).toBe(true);
      await page.keyboard.press('Escape');
      await dialog.waitFor({ state: 'hidden' });
      expect(await page.evaluate('document.activeElement.getAttribute("aria-label")')).toBe(kill);
      expect((await sandbox.getInfo()).state).toBe('running');
      await expectClean(page);
    });

    test('a command typed in the terminal shows its output; output that looks like HTML stays text; a resize reaches the pty', async () => {
      const sandbox = await created({ metadata: { suite: 'terminal' } });
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}/terminal`);
      await page.locator('.terminal[data-state="open"]').waitFor({ timeout: 15_000 });
      await page.locator('.terminal .xterm').click();
      await typeLine(page, 'echo answer=$((6*7))', /^answer=42\s*$/m);
      await typeLine(
        page,
        `printf '%s\\n' '${XSS(3)}'`,
        /^<img src=x onerror=window\.__xss=3>\s*$/m,
      );
      expect(await page.locator('.terminal img').count()).toBe(0);
      await typeLine(page, 'ls -la --color=always /home/user | head -5; uname -sm', /Linux/);
      await shoot(page, 'terminal');
      if (process.env.ABX_UPDATE_DOCS_IMAGES === '1') {
        copyFileSync(
          join(SHOTS, 'terminal.png'),
          join(ROOT, 'docs', 'images', 'dashboard-terminal.png'),
        );
      }
      await page.keyboard.type('clear\n');
      const [, rows, cols] = await typeLine(page, 'stty size', /^(\d+) (\d+)\s*$/m);
      await page.setViewportSize({ width: 900, height: 860 });
      await page.keyboard.type('clear\n');
      await expect
        .poll(
          async () => {
            await page.keyboard.type('stty size\n');
            await page.waitForTimeout(300);
            const sizes = [...(await screenText(page)).matchAll(/^(\d+) (\d+)\s*$/gm)];
            return sizes.at(-1)?.[2];
          },
          { timeout: 15_000 },
        )
        .not.toBe(cols);
      expect(rows).toMatch(/^\d+$/);
      await expectClean(page);
    });

    test('processes are listed and one is killed from the page', async () => {
      const sandbox = await created();
      const sleeper = await sandbox.commands.start('sleep 600');
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}/processes`);
      const line = page.getByRole('row').filter({ hasText: 'sleep 600' });
      await line.waitFor({ timeout: 15_000 });
      await shoot(page, 'processes');
      await line.getByRole('button', { name: /Kill process/ }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Kill' }).click();
      await expect
        .poll(
          async () => (await sandbox.commands.list()).find((p) => p.pid === sleeper.pid)?.running,
          { timeout: 10_000 },
        )
        .toBe(false);
      sleeper.disconnect();
      await expectClean(page);
    });

    test('files: upload by the file input and by a drop, read back with files.read; names and contents stay text; download and image view', async () => {
      const sandbox = await created();
      await sandbox.files.write(`${XSS(2)}.txt`, `${XSS(4)}<script>window.__xss=5</script>`);
      // A 1×1 PNG.
      const png = Buffer.from(
        'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==',
        'base64',
      );
      await sandbox.files.write('pixel.png', png);
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}/files`);
      await page.getByRole('button', { name: `${XSS(2)}.txt`, exact: true }).waitFor({
        timeout: 15_000,
      });

      await page.getByLabel(/^Upload to/).setInputFiles({
        name: 'from-input.txt',
        mimeType: 'text/plain',
        buffer: Buffer.from('sent through the file input\n'),
      });
      await page.getByRole('status').getByText('Uploaded 1 file').waitFor({ timeout: 15_000 });
      expect(await sandbox.files.read('from-input.txt')).toBe('sent through the file input\n');

      const dropped = await page.evaluateHandle(`(() => {
        const transfer = new DataTransfer();
        transfer.items.add(new File(['sent by a drop\\n'], 'dropped.txt', { type: 'text/plain' }));
        return transfer;
      })()`);
      await page.locator('.dropzone').dispatchEvent('drop', { dataTransfer: dropped });
      await page.getByRole('button', { name: 'dropped.txt', exact: true }).waitFor({
        timeout: 15_000,
      });
      expect(await sandbox.files.read('dropped.txt')).toBe('sent by a drop\n');

      // A file whose name and content are HTML: both shown as text.
      await page.getByRole('button', { name: `${XSS(2)}.txt`, exact: true }).click();
      await page
        .locator('pre.file-text')
        .getByText(`${XSS(4)}<script>`)
        .waitFor();
      expect(await page.locator('.viewer img, .viewer script').count()).toBe(0);

      // Downloads are attachments of the bytes.
      const [download] = await Promise.all([
        page.waitForEvent('download'),
        page.getByRole('button', { name: 'Download from-input.txt' }).click(),
      ]);
      expect(download.suggestedFilename()).toBe('from-input.txt');
      expect(readFileSync((await download.path()) as string, 'utf8')).toBe(
        'sent through the file input\n',
      );
      expect(page.url()).toContain(`/#/sandboxes/${sandbox.sandboxId}/files`);

      // An image is shown from a blob: URL.
      await page.getByRole('button', { name: 'pixel.png', exact: true }).click();
      const image = page.locator('.viewer img');
      await image.waitFor();
      expect(await image.getAttribute('src')).toMatch(/^blob:/);
      await shoot(page, 'files');
      await expectClean(page);
    });

    test('a decorated command is called through its form, its result and its error shown as text', async () => {
      await Templates.build(SERVER_E2E_TEMPLATE, { home });
      const sandbox = await created({ template: 'server-e2e' });
      commandRegistry().registerClass(SandboxCommands);
      await sandbox.server.start({ commands: [SandboxCommands] });
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}/commands`);

      const add = page.getByRole('form', { name: 'add' });
      await add.waitFor({ timeout: 20_000 });
      // Its arguments' types and defaults make the form: y defaults to 2.
      expect(await add.getByLabel(/^y \(int, default 2\)/).inputValue()).toBe('2');
      await add.getByLabel(/^x /).fill('40');
      await add.getByRole('button', { name: 'Run add' }).click();
      await add
        .locator('.result pre')
        .getByText('42', { exact: true })
        .waitFor({ timeout: 15_000 });

      const echo = page.getByRole('form', { name: 'slowEcho' });
      await echo.getByLabel(/^value /).fill(XSS(6));
      await echo.getByRole('button', { name: 'Run slowEcho' }).click();
      await echo.locator('.result pre').getByText(XSS(6), { exact: true }).waitFor({
        timeout: 15_000,
      });

      const fail = page.getByRole('form', { name: 'fail' });
      await fail.getByLabel(/^message /).fill('no luck');
      await fail.getByRole('button', { name: 'Run fail' }).click();
      await fail
        .locator('.result.error')
        .getByText(/RangeError.*no luck/)
        .waitFor({
          timeout: 15_000,
        });
      await shoot(page, 'commands');
      await expectClean(page);
    }, 120_000);

    test('a template is built from pasted YAML with its log streaming, then removed', async () => {
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/templates`);
      await page.getByRole('rowheader', { name: 'base', exact: true }).waitFor();
      await page
        .getByLabel('template.yaml')
        .fill(
          'name: dash-built\ndescription: built from the dashboard\nsetup:\n  - echo step one\n  - echo "printed by step $((1 + 1))" >&2\n',
        );
      await page.getByRole('button', { name: 'Build', exact: true }).click();
      const log = page.getByRole('log', { name: 'Build log' });
      await log.getByText('[step 1/2] echo step one').waitFor({ timeout: 60_000 });
      // What each step prints streams into the log too (stderr included), as text.
      await log.getByText('printed by step 2', { exact: true }).waitFor({ timeout: 60_000 });
      await log.getByText('Built template dash-built.').waitFor({ timeout: 60_000 });
      expect((await Templates.list({ home })).map((t) => t.name)).toContain('dash-built');
      await page.getByRole('rowheader', { name: 'dash-built' }).waitFor();
      await shoot(page, 'templates');

      await page.getByRole('button', { name: 'Remove template dash-built' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Remove' }).click();
      await page.getByRole('rowheader', { name: 'dash-built' }).waitFor({ state: 'detached' });
      expect((await Templates.list({ home })).map((t) => t.name)).not.toContain('dash-built');
      await expectClean(page);
    }, 120_000);

    test('a key that is not an admin sees only its own sandboxes, no keys page, and its own snapshots', async () => {
      const viewer = await ApiKeys.create('dash-viewer', { home });
      const mine = await created({ metadata: { who: 'admin' } });
      const theirs = await created({ apiUrl: info.apiUrl, apiKey: viewer.key });
      const page = await newPage();
      await signInWithKey(page, viewer.key);
      await row(page, theirs.sandboxId).waitFor();
      expect(await row(page, mine.sandboxId).count()).toBe(0);
      expect(await page.getByRole('link', { name: 'Keys' }).count()).toBe(0);
      // The admin's sandbox, asked for by id, is unknown to this key.
      await page.goto(`${info.apiUrl}/#/sandboxes/${mine.sandboxId}`);
      await page
        .getByRole('alert')
        .getByText(/does not exist/)
        .waitFor();
      await shoot(page, 'sandboxes-non-admin');

      // It snapshots its own sandbox: the template is its own, which it removes; others' stay hidden.
      await page.goto(`${info.apiUrl}/#/sandboxes`);
      await row(page, theirs.sandboxId)
        .getByRole('button', { name: `Snapshot ${theirs.sandboxId}` })
        .click();
      const dialog = page.getByRole('dialog');
      await dialog.getByText("becomes a template of this key's own").waitFor();
      await dialog.getByLabel('Template name').fill('dash-viewer-snap');
      await dialog.getByRole('button', { name: 'Save snapshot' }).click();
      await dialog.waitFor({ state: 'hidden', timeout: 60_000 });
      const admins = await api('POST', `/v1/sandboxes/${mine.sandboxId}/snapshot`, {
        name: 'dash-admin-snap',
      });
      expect(admins.status).toBe(200);
      await page.goto(`${info.apiUrl}/#/templates`);
      const own = page.getByRole('row').filter({
        has: page.getByRole('rowheader', { name: 'dash-viewer-snap' }),
      });
      await own.getByText('this key').waitFor();
      expect(await page.getByRole('rowheader', { name: 'dash-admin-snap' }).count()).toBe(0);
      expect(await page.getByRole('button', { name: /^Publish / }).count()).toBe(0);
      expect(await page.getByRole('button', { name: 'Remove template base' }).count()).toBe(0);
      await page.getByRole('button', { name: 'Remove template dash-viewer-snap' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Remove' }).click();
      await page
        .getByRole('rowheader', { name: 'dash-viewer-snap' })
        .waitFor({ state: 'detached' });
      await Templates.remove('dash-admin-snap', { home });
      await expectClean(page);
    }, 120_000);

    test('keys: one is created (shown once), listed and revoked; volumes: one is created and removed', async () => {
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.getByRole('link', { name: 'Keys' }).click();
      await page.getByLabel('Name').fill('dash-made');
      await page.getByRole('button', { name: 'Create key' }).click();
      const shown = page.getByLabel('New key');
      await shown.waitFor();
      const key = await shown.inputValue();
      expect(key).toMatch(/^abx_/);
      expect((await api('GET', '/v1/sandboxes', undefined, key)).status).toBe(200);
      await page.getByRole('rowheader', { name: 'dash-made' }).waitFor();
      await shoot(page, 'keys');
      await page.getByRole('button', { name: 'Done' }).click();
      await page.getByRole('button', { name: 'Revoke key dash-made' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Revoke' }).click();
      await page
        .getByRole('button', { name: 'Revoke key dash-made' })
        .waitFor({ state: 'detached' });
      expect((await api('GET', '/v1/sandboxes', undefined, key)).status).toBe(401);

      // Revoked with its sandboxes: one it runs is killed with it.
      const doomed = await ApiKeys.create('dash-doomed', { home });
      const its = await created({ apiUrl: info.apiUrl, apiKey: doomed.key });
      await page.reload();
      await page.getByRole('button', { name: 'Revoke and kill key dash-doomed' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Revoke and kill' }).click();
      await page
        .getByRole('button', { name: 'Revoke and kill key dash-doomed' })
        .waitFor({ state: 'detached' });
      const ended = await api('GET', `/v1/sandboxes/${its.sandboxId}`);
      expect(ended.body).toMatchObject({
        state: 'killed',
        endReason: `killed: its API key ${doomed.id} was revoked`,
      });

      await page.getByRole('link', { name: 'Volumes' }).click();
      await page.getByLabel('Name').fill('dash-volume');
      await page.getByLabel(/^Size/).fill('64M');
      await page.getByRole('button', { name: 'Create volume' }).click();
      await page.getByRole('rowheader', { name: 'dash-volume' }).waitFor({ timeout: 30_000 });
      expect(
        (await api('GET', '/v1/volumes')).body.volumes.map((v: { name: string }) => v.name),
      ).toContain('dash-volume');
      await shoot(page, 'volumes');
      await page.getByRole('button', { name: 'Remove volume dash-volume' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Remove' }).click();
      await page.getByRole('rowheader', { name: 'dash-volume' }).waitFor({
        state: 'detached',
        timeout: 30_000,
      });
      await expectClean(page);
    });

    test('one sandbox’s page: its facts, metrics charts and network policy', async () => {
      const sandbox = await created({ metadata: { suite: 'overview' } });
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}`);
      await page.getByRole('heading', { name: `Sandbox ${sandbox.sandboxId}` }).waitFor();
      // uPlot draws into a canvas once its code has loaded.
      await page.locator('.chart canvas').first().waitFor({ timeout: 15_000 });
      await shoot(page, 'sandbox-overview');
      await page.getByRole('link', { name: 'Network' }).click();
      await page.getByRole('heading', { name: 'Network', level: 2 }).waitFor();
      // The base template's sandboxes are on the internet network: a policy and its counters.
      await page.getByText('Allowed out').waitFor();
      await page.getByText(/\d+ allowed, \d+ refused/).waitFor({ timeout: 15_000 });
      await shoot(page, 'network');
      await expectClean(page);
    });

    test('the Audit tab: a command and a denied destination, allowed from there through the network API', async () => {
      // Denied by address (TEST-NET-1): decided without a lookup, so nothing leaves the machine.
      const sandbox = await created({ network: { allowOut: [], denyOut: ['192.0.2.0/24'] } });
      await sandbox.commands.run('curl -fsS -m 5 http://192.0.2.7/ || true', { timeoutMs: 30_000 });
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}/audit`);
      await page.getByRole('heading', { name: 'Audit trail', level: 2 }).waitFor();
      await page.getByText('curl -fsS -m 5 http://192.0.2.7/ || true').first().waitFor();
      const deniedRow = page.locator('table', { hasText: 'Denied destinations' }).locator('tr', {
        hasText: '192.0.2.7',
      });
      await deniedRow.waitFor({ timeout: 15_000 });
      await shoot(page, 'audit');
      await deniedRow.getByRole('button', { name: 'Allow' }).click();
      await page.getByText('192.0.2.7 is allowed from now on').waitFor();
      // Normalized as policies are: a bare address is its /32.
      expect((await sandbox.getNetwork()).allowOut).toEqual(['192.0.2.7/32']);
      await expectClean(page);
    });

    test('the Events tab: a sandbox’s lifecycle, oldest first, each change once', async () => {
      const sandbox = await created({ metadata: { suite: 'events' } });
      await sandbox.setTimeout(200_000);
      await sandbox.pause();
      await sandbox.resume();
      const page = await newPage();
      await signInWithKey(page, adminKey);
      await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}/events`);
      await page.getByRole('heading', { name: 'Lifecycle events', level: 2 }).waitFor();
      const types = page
        .locator('table', { hasText: 'Events (oldest first)' })
        .locator('tbody tr td:nth-child(2)');
      await types.nth(3).waitFor({ timeout: 15_000 });
      expect(await types.allTextContents()).toEqual(['created', 'updated', 'paused', 'resumed']);
      await page.getByText('frozen (asked)').waitFor();
      await shoot(page, 'events');
      await expectClean(page);
    });

    // A workspace needs a root daemon (docs/workspaces.md); this file's daemon is this process's.
    test.skipIf(process.getuid?.() !== 0)(
      'a workspace’s Changes tab: the changes and a file’s diff as text, an apply’s refusal shown; none for a sandbox without one',
      async () => {
        const folder = mkdtempSync(join(tmpdir(), 'abx-dash-ws-'));
        try {
          writeFileSync(join(folder, 'README.md'), '# demo\nline one\n');
          writeFileSync(join(folder, 'run.sh'), 'echo hi\n');
          const sandbox = await created({ workspace: { from: folder } });
          const evil = `${XSS(9)}.txt`;
          await sandbox.files.write(`/home/user/workspace/${evil}`, `${XSS(10)}\n`);
          await sandbox.commands.run(
            'cd ~/workspace && printf "# demo\\nline 2\\n" > README.md && chmod 755 run.sh && printf "a\\0b" > bin.dat',
          );
          const page = await newPage();
          await signInWithKey(page, adminKey);
          await page.goto(`${info.apiUrl}/#/sandboxes/${sandbox.sandboxId}`);
          await page.getByRole('link', { name: 'Changes' }).click();
          await page.getByRole('heading', { name: 'Changes', level: 2 }).waitFor();
          const rows = page.locator('table.changes tbody tr');
          await expect.poll(() => rows.count(), { timeout: 15_000 }).toBe(4);
          expect(
            (await rows.allInnerTexts()).map((text) => text.split('\t').map((cell) => cell.trim())),
          ).toEqual([
            ['added', evil, '', '0644'],
            ['modified', 'README.md', '', '0644'],
            ['added', 'bin.dat', 'binary', '0644'],
            ['modified', 'run.sh', '', '0644 → 0755'],
          ]);
          // The agent's file name and content are text: no element made of them, nothing run.
          await page.getByRole('button', { name: evil, exact: true }).click();
          const diff = page.locator('pre.diff');
          await diff.waitFor();
          expect(await diff.textContent()).toContain(`+${XSS(10)}`);
          expect(await page.locator('table.changes img, pre.diff img').count()).toBe(0);
          await page.getByRole('button', { name: 'README.md', exact: true }).click();
          await expect.poll(() => diff.textContent()).toContain('-line one\n+line 2');
          await shoot(page, 'changes');

          // A host edit meanwhile: the apply (with the session's CSRF token) is refused by name.
          utimesSync(join(folder, 'README.md'), new Date(), new Date(Date.now() + 5000));
          await page.getByRole('button', { name: 'Apply to host folder' }).click();
          await page.getByRole('dialog').getByRole('button', { name: 'Apply' }).click();
          const refusal = page.getByRole('dialog').getByRole('alert');
          await refusal.waitFor();
          expect(await refusal.textContent()).toMatch(/README\.md/);
          expect(await refusal.textContent()).not.toMatch(/csrf/i);
          expect(readFileSync(join(folder, 'README.md'), 'utf8')).toBe('# demo\nline one\n');
          expect(existsSync(join(folder, evil))).toBe(false);
          await page.keyboard.press('Escape');
          await expectClean(page);

          // A sandbox without a workspace has no such tab, and its address says why.
          const plain = await created();
          await page.goto(`${info.apiUrl}/#/sandboxes/${plain.sandboxId}/changes`);
          await page.getByText('This sandbox has no workspace').waitFor();
          expect(await page.getByRole('link', { name: 'Changes' }).count()).toBe(0);
          await expectClean(page);
        } finally {
          for (const sandbox of sandboxes.splice(0)) await sandbox.kill().catch(() => undefined);
          rmSync(folder, { recursive: true, force: true });
        }
      },
    );
  },
);
