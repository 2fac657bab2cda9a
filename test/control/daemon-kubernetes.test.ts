import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { call, type Json } from '../helpers/api-call.js';
import { kubeDoubles, NAMESPACE } from '../helpers/kube-fixture.js';

// The daemon on the kubernetes provider against the API double: the API creates a pod, the
// gateway reaches envd over TCP at the pod's address (the TCP seam), a port inside is reached
// through envd's forwarder on the pod's address, and deleting the sandbox removes the pod.
const kube = kubeDoubles('daemon-kube');
const { unavailable } = kube;
let daemon: Daemon | undefined;

afterAll(async () => {
  await daemon?.stop().catch(() => undefined);
});

describe.skipIf(unavailable)(
  `the daemon on the kubernetes provider (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    test('create makes a pod; the gateway reaches its envd and a port inside over TCP; delete removes the pod', async () => {
      const home = join(kube.scratch, 'home');
      const provider = kube.provider();
      daemon = new Daemon({ home, provider, apiPort: 0, gatewayPort: 0, warmPool: 0 });
      const info = await daemon.start();
      const auth = {
        authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
      };

      const template = await call(`${info.apiUrl}/v1/templates`, {
        method: 'POST',
        headers: auth,
        body: {
          yaml: [
            'name: k8s-ports',
            'capabilities: [shell, files, ports]',
            'kubernetes:',
            '  runtime_class: gvisor',
            '  node_selector: { pool: sandboxes }',
          ].join('\n'),
        },
      });
      expect(template.status, JSON.stringify(template.body)).toBe(200);
      const created = await call(`${info.apiUrl}/v1/sandboxes`, {
        method: 'POST',
        headers: auth,
        body: { template: 'k8s-ports', envs: { GREETING: 'from the API' } },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const { sandboxId, accessToken } = created.body;
      expect(kube.double.objects('pods')).toEqual([`pods ${NAMESPACE}/abx-${sandboxId}`]);
      // The template's kubernetes: section reached the pod.
      const pod = kube.double.get('pods', NAMESPACE, `abx-${sandboxId}`);
      expect(pod?.spec.runtimeClassName).toBe('gvisor');
      expect(pod?.spec.nodeSelector).toEqual({ pool: 'sandboxes' });

      const envd = { 'x-sandbox-id': sandboxId, 'x-sandbox-port': '49983' };
      const ran = await call(`${info.gatewayUrl}/process/exec`, {
        method: 'POST',
        headers: { ...envd, 'x-access-token': accessToken },
        body: { cmd: 'id -u; echo "$GREETING"; hostname' },
      });
      expect(ran).toMatchObject({
        status: 200,
        body: { stdout: `1000\nfrom the API\n${sandboxId}\n`, exit_code: 0 },
      });
      const refused = await call(`${info.gatewayUrl}/process/exec`, {
        method: 'POST',
        headers: { ...envd, 'x-access-token': 'wrong' },
        body: { cmd: 'true' },
      });
      expect(refused.status).toBe(401);

      // A server inside on 127.0.0.1 only, as the command server listens: envd forwards the pod's
      // address to it.
      await call(`${info.gatewayUrl}/process/start`, {
        method: 'POST',
        headers: { ...envd, 'x-access-token': accessToken },
        body: {
          cmd: `exec node -e "require('http').createServer((q, s) => s.end('inside ' + q.url)).listen(8125, '127.0.0.1')"`,
        },
      });
      const port = {
        'x-sandbox-id': sandboxId,
        'x-sandbox-port': '8125',
        'x-access-token': accessToken,
      };
      let served: { status: number; body: Json } | undefined;
      for (const deadline = Date.now() + 10_000; Date.now() < deadline; ) {
        served = await call(`${info.gatewayUrl}/hello`, { headers: port }).catch(() => undefined);
        if (served?.status === 200) break;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(served).toEqual({ status: 200, body: 'inside /hello' });

      const removed = await call(`${info.apiUrl}/v1/sandboxes/${sandboxId}`, {
        method: 'DELETE',
        headers: auth,
      });
      expect(removed.status).toBeLessThan(300);
      expect(kube.double.objects('pods')).toEqual([]);
      expect(kube.double.objects('secrets')).toEqual([]);
      expect(kube.double.livePids()).toEqual([]);
    });
  },
);
