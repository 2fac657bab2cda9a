import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { call } from '../helpers/api-call.js';
import { kubeDoubles, NAMESPACE } from '../helpers/kube-fixture.js';

// The daemon on the kubernetes provider in agent-sandbox claims mode, against the API double: a
// create is a SandboxClaim on the template's SandboxWarmPool, the gateway reaches the claimed
// pod's envd with the sandbox's own token, and the daemon keeps no warm pool of its own (the
// cluster's pool is the one): a create leaves exactly one claim, however warm-pool is set.
const kube = kubeDoubles('daemon-kube-claims', [{ crds: true }]);
const { unavailable } = kube;
let daemon: Daemon | undefined;

afterAll(async () => {
  await daemon?.stop().catch(() => undefined);
});

describe.skipIf(unavailable)(
  `the daemon on the kubernetes provider with agent-sandbox claims (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    test('create claims a pod of the template’s warm pool; the gateway reaches it with the sandbox’s token only; no second pool; delete removes the claim and its pod', async () => {
      const home = join(kube.scratch, 'home');
      const provider = kube.provider({ agentSandbox: 'claims' });
      // A warm pool size that the daemon would use if it pooled too.
      daemon = new Daemon({ home, provider, apiPort: 0, gatewayPort: 0, warmPool: 2 });
      const info = await daemon.start();
      const auth = {
        authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
      };
      const template = await call(`${info.apiUrl}/v1/templates`, {
        method: 'POST',
        headers: auth,
        body: { yaml: ['name: k8s-claims', 'capabilities: [shell, files]'].join('\n') },
      });
      expect(template.status, JSON.stringify(template.body)).toBe(200);
      const created = await call(`${info.apiUrl}/v1/sandboxes`, {
        method: 'POST',
        headers: auth,
        body: { template: 'k8s-claims', envs: { GREETING: 'from the API' } },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const { sandboxId, accessToken } = created.body;
      expect(kube.double.objects('sandboxclaims')).toEqual([
        `sandboxclaims ${NAMESPACE}/abx-${sandboxId}`,
      ]);
      const bound = kube.double.get('sandboxclaims', NAMESPACE, `abx-${sandboxId}`)?.status.sandbox
        .name as string;

      const envd = { 'x-sandbox-id': sandboxId, 'x-sandbox-port': '49983' };
      const ran = await call(`${info.gatewayUrl}/process/exec`, {
        method: 'POST',
        headers: { ...envd, 'x-access-token': accessToken },
        body: { cmd: 'id -u; echo "$GREETING"; echo "$ABX_SANDBOX_ID"' },
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

      // The daemon's own pool would have claimed more by now (its refill starts at once).
      await new Promise((resolve) => setTimeout(resolve, 1500));
      expect(kube.double.objects('sandboxclaims')).toHaveLength(1);

      const removed = await call(`${info.apiUrl}/v1/sandboxes/${sandboxId}`, {
        method: 'DELETE',
        headers: auth,
      });
      expect(removed.status).toBeLessThan(300);
      expect(kube.double.objects('sandboxclaims')).toEqual([]);
      expect(kube.double.objects().filter((o) => o.endsWith(`/${bound}`))).toEqual([]);
      expect(kube.double.livePids(bound)).toEqual([]);
    });
  },
);
