import { createHash } from 'node:crypto';
import type { SandboxRecord } from '../../src/control/registry.js';

/**
 * A running sandbox's record as the gateway reads it, for a fake sandbox whose envd (and ports)
 * are servers a test made on Unix sockets: the gateway checks `token` against it and connects to
 * `envdSocket`.
 */
export function gatewayRecord(options: {
  id: string;
  token: string;
  envdSocket: string;
  portsDir: string;
  capabilities: string[];
  /** Root's envd, for a sandbox whose template allows root. */
  envdRootSocket?: string;
}): SandboxRecord {
  const { id, token, envdSocket, portsDir, capabilities, envdRootSocket } = options;
  return {
    id,
    template: `tpl-${id}`,
    state: 'running',
    metadata: {},
    createdAt: 0,
    expiresAt: 0,
    endedAt: null,
    endReason: null,
    tokenHash: createHash('sha256').update(token).digest('hex'),
    owner: null,
    paused: null,
    lifecycle: null,
    volumeMounts: [],
    handle: {
      provider: 'memory',
      pid: process.pid,
      startTime: id,
      envdSocket,
      portsDir,
      ...(envdRootSocket ? { envdRootSocket } : {}),
    },
    capabilities,
  };
}
