import {
  ApiException,
  KubeConfig,
  NetworkingV1Api,
  type V1NetworkPolicy,
} from '@kubernetes/client-node';
import { SandboxError, UnavailableError } from '../../errors.js';
import { kubeconfigSource } from './kubeconfig-source.js';

/** Where the provider finds its cluster. */
export interface KubeConfigOptions {
  /** A loaded configuration (tests); wins over everything else. */
  kubeConfig?: KubeConfig;
  /** A kubeconfig file; default: `KUBECONFIG`, `~/.kube/config`, or the pod's service account. */
  kubeconfigPath?: string;
  /** The context to use; default the file's current context. */
  context?: string;
}

/** The configuration from the standard places (or the ones given). */
export function loadKubeConfig(options: KubeConfigOptions): KubeConfig {
  if (options.kubeConfig) return options.kubeConfig;
  const config = new KubeConfig();
  const found = kubeconfigSource(options.kubeconfigPath);
  if ('missing' in found) throw new UnavailableError(found.missing);
  try {
    if (options.kubeconfigPath) config.loadFromFile(options.kubeconfigPath);
    else config.loadFromDefault();
  } catch (error) {
    throw new UnavailableError(
      `cannot read the Kubernetes configuration${options.kubeconfigPath ? ` ${options.kubeconfigPath}` : ''}: ${(error as Error).message}`,
      { cause: error },
    );
  }
  if (options.context) config.setCurrentContext(options.context);
  if (!config.getCurrentCluster()) {
    throw new UnavailableError(
      'no Kubernetes cluster configured: set KUBECONFIG (or pass --kubeconfig), or run the daemon in a pod with a service account',
    );
  }
  return config;
}

/** The API server's address, for messages. */
export function serverOf(config: KubeConfig): string {
  return config.getCurrentCluster()?.server ?? 'the configured API server';
}

/** The HTTP status of a failed API call; undefined when the server was not reached. */
export function statusOf(error: unknown): number | undefined {
  if (error instanceof ApiException) return error.code;
  const code = (error as { code?: unknown; statusCode?: unknown }) ?? {};
  if (typeof code.statusCode === 'number') return code.statusCode;
  return undefined;
}

/** The Status message the API server answered with, or the error's own message. */
export function kubeMessage(error: unknown): string {
  if (error instanceof ApiException) {
    let body = error.body as unknown;
    if (typeof body === 'string') {
      const text = body;
      try {
        body = JSON.parse(text);
      } catch {
        return `${error.code}: ${text.slice(0, 300)}`;
      }
    }
    const message = (body as { message?: unknown } | undefined)?.message;
    return typeof message === 'string' ? message : `HTTP ${error.code}`;
  }
  return (error as Error)?.message ?? String(error);
}

const UNREACHABLE = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'EPIPE',
  'CERT_HAS_EXPIRED',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
]);

/** The errno-like code of a failure to reach the server (node-fetch's FetchError and its cause). */
function networkCode(error: unknown): string | undefined {
  for (let at = error as { code?: unknown; errno?: unknown; cause?: unknown } | undefined; at; ) {
    for (const value of [at.code, at.errno]) {
      if (typeof value === 'string' && UNREACHABLE.has(value)) return value;
    }
    at = at.cause as typeof at;
  }
  const type = (error as { type?: unknown })?.type;
  return type === 'system' || type === 'request-timeout' ? 'no answer' : undefined;
}

/**
 * An API call's failure as the project's errors: a server that cannot be reached is an
 * {@link UnavailableError} naming it and what to check; an answer is a {@link SandboxError} with
 * the server's own message (status attached as `status`).
 */
export function kubeError(error: unknown, what: string, server: string): SandboxError {
  if (error instanceof SandboxError) return error;
  const code = networkCode(error);
  if (code && statusOf(error) === undefined) {
    return new UnavailableError(
      `the Kubernetes API server at ${server} does not answer (${code}) while ${what}: check that the cluster is up and that KUBECONFIG (or --kubeconfig) points at it`,
      { cause: error },
    );
  }
  const status = statusOf(error);
  if (status === 401 || status === 403) {
    return new UnavailableError(
      `the Kubernetes API server at ${server} refused ${what} (${status}): ${kubeMessage(error)}; the daemon's account needs the RBAC rules in docs/providers.md (abx doctor --provider kubernetes checks them)`,
      { cause: error },
    );
  }
  return new SandboxError(`${what} failed: ${kubeMessage(error)}`, { cause: error });
}

/** How often a replace that lost a race with another writer (409) is tried again. */
const REPLACE_TRIES = 3;

/**
 * The NetworkPolicies of one namespace (`networking.k8s.io/v1`): create, read, replace, delete,
 * list by label. Failures are the client's own (`statusOf`, `kubeError` read them).
 */
export class NetworkPolicies {
  private readonly api: NetworkingV1Api;

  constructor(
    config: KubeConfig,
    readonly namespace: string,
  ) {
    this.api = config.makeApiClient(NetworkingV1Api);
  }

  create(body: V1NetworkPolicy): Promise<V1NetworkPolicy> {
    return this.api.createNamespacedNetworkPolicy({ namespace: this.namespace, body });
  }

  read(name: string): Promise<V1NetworkPolicy> {
    return this.api.readNamespacedNetworkPolicy({ name, namespace: this.namespace });
  }

  /** A PUT: with `metadata.resourceVersion` the server refuses (409) if it changed meanwhile. */
  replace(body: V1NetworkPolicy): Promise<V1NetworkPolicy> {
    return this.api.replaceNamespacedNetworkPolicy({
      name: body.metadata?.name as string,
      namespace: this.namespace,
      body,
    });
  }

  /** Deletes one; false when it was not there. */
  async delete(name: string): Promise<boolean> {
    try {
      await this.api.deleteNamespacedNetworkPolicy({ name, namespace: this.namespace });
      return true;
    } catch (error) {
      if (statusOf(error) === 404) return false;
      throw error;
    }
  }

  async list(labelSelector: string): Promise<V1NetworkPolicy[]> {
    return (
      await this.api.listNamespacedNetworkPolicy({ namespace: this.namespace, labelSelector })
    ).items;
  }

  /**
   * Makes `body` the policy of its name: the stored one's spec replaced (read first, its
   * resourceVersion sent, so a concurrent change is never overwritten blindly; its labels kept
   * under `body`'s, its owners kept when it has any), or `body` created when there is none.
   */
  async put(body: V1NetworkPolicy): Promise<V1NetworkPolicy> {
    const name = body.metadata?.name as string;
    for (let attempt = 1; ; attempt++) {
      let stored: V1NetworkPolicy;
      try {
        stored = await this.read(name);
      } catch (error) {
        if (statusOf(error) !== 404) throw error;
        try {
          return await this.create(body);
        } catch (created) {
          if (statusOf(created) !== 409 || attempt >= REPLACE_TRIES) throw created;
          continue;
        }
      }
      const owners = stored.metadata?.ownerReferences?.length
        ? stored.metadata.ownerReferences
        : body.metadata?.ownerReferences;
      try {
        return await this.replace({
          ...body,
          metadata: {
            ...body.metadata,
            labels: { ...stored.metadata?.labels, ...body.metadata?.labels },
            ...(owners ? { ownerReferences: owners } : {}),
            resourceVersion: stored.metadata?.resourceVersion as string,
          },
        });
      } catch (error) {
        if (statusOf(error) !== 409 || attempt >= REPLACE_TRIES) throw error;
      }
    }
  }
}
