import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

/**
 * The dashboard (docs/dashboard.md): built into dist/ui, which the daemon serves at `/` on its
 * API listener. `vite --config ui/vite.config.ts` serves it for development, sending `/v1` and
 * `/ui` to the daemon named by ABX_DASHBOARD_API (default http://127.0.0.1:41234).
 */
const api = process.env.ABX_DASHBOARD_API ?? 'http://127.0.0.1:41234';

export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: '/',
  // Preact's automatic JSX runtime through Vite's own transform: no plugin needed.
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: fileURLToPath(new URL('../dist/ui', import.meta.url)),
    emptyOutDir: true,
    target: 'es2022',
    // The page's CSP allows no inline script and no data: scripts: every asset is a file.
    assetsInlineLimit: 0,
    sourcemap: false,
    reportCompressedSize: false,
  },
  server: {
    proxy: {
      '/v1': { target: api, changeOrigin: false },
      '/ui': { target: api, changeOrigin: false },
    },
  },
});
