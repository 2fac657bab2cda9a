import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll } from 'vitest';
import {
  KubernetesProvider,
  type KubernetesProviderOptions,
} from '../../src/providers/kubernetes/kubernetes-provider.js';
import { portableRuntime } from '../../src/providers/portable-runtime.js';
import { AGENT_SANDBOX_VALIDATORS } from './agent-sandbox-schemas.js';
import { ensureBuilt, ROOT } from './build.js';
import { KubeApiDouble, type KubeApiDoubleOptions, kubeletUnavailable } from './kube-api-double.js';

/** The namespace the Kubernetes tests' sandboxes run in. */
export const NAMESPACE = 'sandboxes';
/** The runtime image the tests' pods name (the double's kubelet uses the built portable runtime). */
export const RUNTIME_IMAGE = 'abx-runtime:test';

export interface KubeDoubles {
  /** Why the double's kubelet cannot run pods here (the hooks then do nothing), if it cannot. */
  readonly unavailable: string | undefined;
  /** A folder of the block's own (once `beforeAll` ran), removed after it. */
  readonly scratch: string;
  /** The doubles in the order asked, once `beforeAll` ran. */
  readonly all: KubeApiDouble[];
  /** The first double. */
  readonly double: KubeApiDouble;
  /** A provider on a double (default the first) in {@link NAMESPACE}, closed after the block. */
  provider(options?: KubernetesProviderOptions, on?: KubeApiDouble): KubernetesProvider;
}

/**
 * Kubernetes API doubles for a test file or a describe block: started in `beforeAll` with a
 * portable runtime built from `dist/` as the runtime image, and after the block the providers
 * made through it closed, the doubles closed (their pods' processes stopped), the scratch folder
 * removed, and the block failed if any object a provider sent did not validate. `crds` serves
 * agent-sandbox, its Sandboxes checked against the CRD's schema.
 */
export function kubeDoubles(
  label: string,
  wanted: ({ crds?: boolean } & Pick<
    KubeApiDoubleOptions,
    'metricsApi' | 'storageClasses' | 'defaultStorageClass'
  >)[] = [{}],
): KubeDoubles {
  const unavailable = kubeletUnavailable();
  let scratch: string | undefined;
  const all: KubeApiDouble[] = [];
  const providers: KubernetesProvider[] = [];

  beforeAll(async () => {
    if (unavailable) return;
    // Made here, not when the file is collected: a skipped block leaves no folder behind.
    scratch = mkdtempSync(join(tmpdir(), `abx-${label}-`));
    ensureBuilt();
    const runtime = await portableRuntime({
      runtimeDir: join(ROOT, 'dist', 'runtime'),
      cacheDir: join(scratch, 'runtime-image'),
    });
    for (const [i, { crds, ...more }] of wanted.entries()) {
      const double = new KubeApiDouble({
        dir: join(scratch, `node-${i}`),
        runtimeImageDir: runtime.dir,
        ...(crds ? { crds: true, validators: AGENT_SANDBOX_VALIDATORS } : {}),
        ...more,
      });
      all.push(double);
      await double.start();
    }
  }, 120_000);

  afterAll(async () => {
    for (const provider of providers) await provider.close().catch(() => undefined);
    for (const double of all) await double.close();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
    const invalid = all.flatMap((double) => double.invalid);
    if (invalid.length) {
      throw new Error(`the provider sent invalid objects: ${JSON.stringify(invalid)}`);
    }
  });

  return {
    unavailable,
    get scratch() {
      return scratch as string;
    },
    all,
    get double() {
      return all[0] as KubeApiDouble;
    },
    provider(options = {}, on = all[0] as KubeApiDouble) {
      const provider = new KubernetesProvider({
        kubeConfig: on.kubeConfig(NAMESPACE),
        runtimeImage: RUNTIME_IMAGE,
        ...options,
      });
      providers.push(provider);
      return provider;
    },
  };
}
