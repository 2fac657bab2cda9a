import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test as base } from 'vitest';
import { runSetupStep, setSandboxEnv } from '../../src/control/envd-request.js';
import { sandboxToken } from '../../src/control/ids.js';
import { Reaper } from '../../src/control/reaper.js';
import type { Registry } from '../../src/control/registry.js';
import { SandboxService } from '../../src/control/sandbox-service.js';
import { SqliteRegistry } from '../../src/control/sqlite-registry.js';
import { TemplateService } from '../../src/control/template-service.js';
import { MemoryProvider, type MemoryProviderOptions } from '../helpers/memory-provider.js';

/** The token secret of every plane the tests open. */
export const TOKEN_SECRET = 'control-plane-test-secret';

/** A control plane without a daemon: the services on a registry file, over a memory provider. */
export interface Plane {
  dir: string;
  database: string;
  sandboxesDir: string;
  templatesDir: string;
  provider: MemoryProvider;
  registry: Registry;
  templates: TemplateService;
  sandboxes: SandboxService;
  /** Not started: a test calls `reaper.pass()` when it wants one. */
  reaper: Reaper;
}

export interface PlaneOptions extends MemoryProviderOptions {
  warmPool?: number;
  /** Another plane's folder and provider: a new "daemon" on the same registry file and host. */
  after?: Plane;
}

/**
 * Opens planes for one test and, after it (passed or not), closes their services and registries,
 * every server of their providers, and removes their folders.
 */
export const test = base.extend<{ open: (options?: PlaneOptions) => Plane }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  open: async ({}, use) => {
    const opened: Plane[] = [];
    const folders = new Set<string>();
    try {
      await use((options = {}) => {
        const dir = options.after?.dir ?? mkdtempSync(join(tmpdir(), 'abx-control-'));
        folders.add(dir);
        const sandboxesDir = join(dir, 'sandboxes');
        const templatesDir = join(dir, 'templates');
        mkdirSync(sandboxesDir, { recursive: true });
        mkdirSync(templatesDir, { recursive: true });
        const provider = options.after?.provider ?? new MemoryProvider(options);
        const database = join(dir, 'abx.db');
        const registry = new SqliteRegistry(database);
        const templates = new TemplateService(registry, provider, templatesDir, runSetupStep);
        const sandboxes = new SandboxService(
          registry,
          provider,
          templates,
          sandboxesDir,
          (id, kind) => sandboxToken(TOKEN_SECRET, id, kind),
          setSandboxEnv,
          options.warmPool ?? 1,
        );
        const plane = {
          dir,
          database,
          sandboxesDir,
          templatesDir,
          provider,
          registry,
          templates,
          sandboxes,
          reaper: new Reaper(sandboxes.reaperHost()),
        };
        opened.push(plane);
        return plane;
      });
    } finally {
      for (const plane of opened.reverse()) {
        await plane.sandboxes.close().catch(() => undefined);
        await plane.provider.dispose();
        await plane.registry.close().catch(() => undefined);
      }
      for (const dir of folders) rmSync(dir, { recursive: true, force: true });
    }
  },
});

/** Resolves once `check` holds, or throws after `timeoutMs`. */
export async function until(
  check: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 2000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
