import { defineConfig } from 'vitest/config';

export default defineConfig({
  // Vite 8 transforms with oxc; legacy decorators + metadata match what tsc emits for users.
  oxc: { decorator: { legacy: true, emitDecoratorMetadata: true } },
  test: {
    include: ['test/**/*.test.ts'],
    setupFiles: ['test/setup.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 120_000,
  },
});
