import { defineConfig } from 'vitest/config';

/** How many test files run at once: ABX_TEST_WORKERS (a whole number ≥ 1), else 2. */
function testWorkers(text: string | undefined): number {
  if (text === undefined || text === '') return 2;
  const count = Number(text);
  if (!Number.isInteger(count) || count < 1) {
    throw new Error(
      `ABX_TEST_WORKERS must be a whole number of test files at once (1 or more), not '${text}'`,
    );
  }
  return count;
}

export default defineConfig({
  // Vite 8 transforms with oxc; legacy decorators + metadata match what tsc emits for users.
  oxc: { decorator: { legacy: true, emitDecoratorMetadata: true } },
  test: {
    include: ['test/**/*.test.ts'],
    setupFiles: ['test/setup.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 120_000,
    // Two test files at a time, whatever the core count (Vitest's default is one fewer worker than
    // cores: one on the 2-core machines CI runs on). Every file's daemon has its own home and
    // random ports and sandbox uids are locked host-wide, so files do not share state; two at a
    // time took the suite from 2108 s to 1722 s on 2 cores with every file passing
    // (docs/development.md, "Test files side by side"). ABX_TEST_WORKERS=1 runs one at a time.
    maxWorkers: testWorkers(process.env.ABX_TEST_WORKERS),
  },
});
