import { statfs } from 'node:fs/promises';
import os from 'node:os';
import { fsAction, safePath } from '../file-system.js';
import { defineGroup } from '../route-group.js';
import { argList } from '../validate.js';

/** Variables that must not leave the server: its own token. */
const SECRET_ENV = /TOKEN|SECRET|PASSWORD|KEY/i;

/** Facts about the sandbox machine and the server itself. */
export const SYSTEM = defineGroup('SYSTEM', '/system', 'os, cpu, memory, disk, env, metrics', [
  {
    method: 'GET',
    path: '/system/os',
    summary: 'Platform, kernel release, architecture, hostname, uptime, node version.',
    handler: () => ({
      platform: os.platform(),
      release: os.release(),
      arch: os.arch(),
      hostname: os.hostname(),
      uptime_s: os.uptime(),
      node: process.version,
      user: os.userInfo().username,
    }),
  },
  {
    method: 'GET',
    path: '/system/cpu',
    summary: 'CPU count and model, load averages.',
    handler: () => {
      const cpus = os.cpus();
      return { count: cpus.length, model: cpus[0]?.model ?? 'unknown', loadavg: os.loadavg() };
    },
  },
  {
    method: 'GET',
    path: '/system/memory',
    summary: 'Total and free memory in bytes, and the server process memory.',
    handler: () => ({ total: os.totalmem(), free: os.freemem(), server: process.memoryUsage() }),
  },
  {
    method: 'GET',
    path: '/system/disk',
    summary: 'Total, free and available bytes of the file system holding `path` (default /).',
    args: argList({ 'path?': ['str', '/'] }),
    handler: async ({ args }) => {
      const path = safePath(args.path as string);
      const s = await fsAction(`read disk usage of ${path}`, () => statfs(path));
      return {
        path,
        total: s.blocks * s.bsize,
        free: s.bfree * s.bsize,
        available: s.bavail * s.bsize,
      };
    },
  },
  {
    method: 'GET',
    path: '/system/env',
    summary: 'Environment of the server, with values of secret-looking names (TOKEN, KEY…) hidden.',
    handler: () => ({
      env: Object.fromEntries(
        Object.entries(process.env).map(([k, v]) => [k, SECRET_ENV.test(k) ? '(hidden)' : v]),
      ),
      cwd: process.cwd(),
    }),
  },
  {
    method: 'GET',
    path: '/system/metrics',
    summary: 'Server metrics: requests, in flight, by status, mean latency, uptime, RSS.',
    handler: ({ ctx }) => ctx.metrics.snapshot(),
  },
]);
