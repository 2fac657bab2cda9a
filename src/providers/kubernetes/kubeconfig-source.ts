import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';

/** The service account files a pod gets: what in-cluster configuration reads. */
export const SERVICE_ACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/** What to do when no configuration is found (doctor and the daemon say the same). */
export const KUBECONFIG_HOW =
  'set KUBECONFIG to a kubeconfig file (abx doctor also takes --kubeconfig), e.g. one that `kubectl config view --raw` prints on a machine that reaches the cluster, or run the daemon in a pod with a service account';

/**
 * Where the Kubernetes configuration would come from, looked up the way @kubernetes/client-node's
 * `loadFromDefault` does (`KUBECONFIG`, `~/.kube/config`, the pod's service account), without
 * loading that client. `missing` says what was looked for when there is none: the client itself
 * would then quietly aim at `http://localhost:8080` and fail with a TLS-option error.
 */
export function kubeconfigSource(
  kubeconfigPath?: string,
  env: NodeJS.ProcessEnv = process.env,
): { source: string } | { missing: string } {
  if (kubeconfigPath) {
    return existsSync(kubeconfigPath)
      ? { source: kubeconfigPath }
      : {
          missing: `no kubeconfig found: the file ${kubeconfigPath} does not exist; ${KUBECONFIG_HOW}`,
        };
  }
  if (env.KUBECONFIG) {
    const files = env.KUBECONFIG.split(delimiter).filter(Boolean);
    const absent = files.filter((file) => !existsSync(file));
    if (absent.length === 0) return { source: `KUBECONFIG (${files.join(delimiter)})` };
    return {
      missing: `no kubeconfig found: KUBECONFIG names ${absent.join(', ')}, which ${absent.length === 1 ? 'does' : 'do'} not exist; ${KUBECONFIG_HOW}`,
    };
  }
  const home = env.HOME || homedir();
  const file = join(home, '.kube', 'config');
  if (existsSync(file)) return { source: file };
  if (existsSync(SERVICE_ACCOUNT_TOKEN) && env.KUBERNETES_SERVICE_HOST) {
    return { source: 'in-cluster (the pod’s service account)' };
  }
  return {
    missing: `no kubeconfig found (KUBECONFIG, ~/.kube/config, in-cluster): KUBECONFIG is not set, ${file} does not exist and this is not a pod with a service account; ${KUBECONFIG_HOW}`,
  };
}
