import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import {
  NotFoundError,
  PermissionDeniedError,
  type SandboxError,
  UnavailableError,
} from '../../errors.js';
import { dockerMessage, engineAddress, engineError, statusOf } from './engine.js';
import { type DockerEngine, followProgress } from './engine-client.js';
import { DOCKER_HUB, parseImageReference, splitTag } from './image-reference.js';

/** What the engine's `X-Registry-Auth` header carries (base64url JSON, see engine-client.ts). */
export interface RegistryAuth {
  username?: string;
  password?: string;
  identitytoken?: string;
  serveraddress: string;
}

/** The keys a docker config.json may file Docker Hub's credentials under. */
const HUB_KEYS = ['https://index.docker.io/v1/', 'index.docker.io', DOCKER_HUB];

/**
 * Credentials for pushing to `registry`, where the docker CLI keeps them or from the environment:
 * `ABX_REGISTRY_USERNAME` and `ABX_REGISTRY_PASSWORD` (any registry), else the `auths` entry of
 * `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`, what `docker login` writes when
 * no credential helper is set up). None found: the push goes without (an open registry).
 */
export function registryAuth(
  registry: string,
  env: NodeJS.ProcessEnv = process.env,
): RegistryAuth | undefined {
  if (env.ABX_REGISTRY_USERNAME && env.ABX_REGISTRY_PASSWORD) {
    return {
      username: env.ABX_REGISTRY_USERNAME,
      password: env.ABX_REGISTRY_PASSWORD,
      serveraddress: registry,
    };
  }
  const file = join(env.DOCKER_CONFIG || join(homedir(), '.docker'), 'config.json');
  let auths: Record<string, { auth?: string; identitytoken?: string }>;
  try {
    auths = JSON.parse(readFileSync(file, 'utf8')).auths ?? {};
  } catch {
    return undefined;
  }
  const keys = registry === DOCKER_HUB ? HUB_KEYS : [registry];
  for (const [key, entry] of Object.entries(auths)) {
    const host = key.replace(/^https?:\/\//, '').replace(/\/.*$/, '');
    if (!keys.includes(key) && !keys.includes(host)) continue;
    if (entry.identitytoken) return { identitytoken: entry.identitytoken, serveraddress: registry };
    if (!entry.auth) continue;
    const plain = Buffer.from(entry.auth, 'base64').toString('utf8');
    const colon = plain.indexOf(':');
    if (colon < 0) continue;
    return {
      username: plain.slice(0, colon),
      password: plain.slice(colon + 1),
      serveraddress: registry,
    };
  }
  return undefined;
}

/** Words of an engine's push error that mean the registry could not be reached or spoken to. */
const UNREACHABLE =
  /connection refused|no such host|dial tcp|i\/o timeout|timeout|connection reset|network is unreachable|server gave HTTP response to HTTPS client|x509|tls:|certificate/i;
/** ... that mean it refused these credentials (or their absence). */
const REFUSED =
  /unauthorized|authentication required|denied|no basic auth credentials|forbidden|\b40[13]\b/i;

/** A push failure in the engine's words, as an error naming the registry and what to do. */
export function pushError(
  message: string,
  reference: string,
  address: string,
  cause?: unknown,
): SandboxError {
  const { registry } = parseImageReference(reference);
  const options = cause === undefined ? undefined : { cause };
  if (REFUSED.test(message)) {
    return new PermissionDeniedError(
      `the registry ${registry} refused to take ${reference} (${message}); give credentials that may push there: \`docker login ${registry}\` on the host of the Docker engine (${address}), or ABX_REGISTRY_USERNAME and ABX_REGISTRY_PASSWORD`,
      options,
    );
  }
  if (UNREACHABLE.test(message)) {
    return new UnavailableError(
      `cannot push ${reference}: the registry ${registry} cannot be reached from the Docker engine at ${address} (${message}); check its address and that it runs, and for a registry on plain HTTP beyond 127.0.0.0/8 add it to the engine's insecure-registries`,
      options,
    );
  }
  return new UnavailableError(`pushing ${reference} to ${registry} failed: ${message}`, options);
}

/** The end of a push's progress stream: the digest the registry gave, or the first error. */
async function followPush(stream: Readable): Promise<string | undefined> {
  const events = await followProgress(stream);
  return events.find((event) => event.aux?.Digest)?.aux?.Digest;
}

/** What a push made: the reference pods pull, and the registry's digest of its manifest. */
export interface PushedImage {
  reference: string;
  digest?: string;
}

/**
 * Pushes the local image `image` as `target` (`registry/repository:tag`) through the engine (its
 * `POST /images/{name}/push`, credentials in `X-Registry-Auth`, see {@link registryAuth}). A tag
 * made for the push is removed again when the push fails, so a failure leaves the engine as it
 * was; on success `target` stays as a local tag of the same image.
 */
export async function pushImage(
  docker: DockerEngine,
  image: string,
  target: string,
  options: { auth?: RegistryAuth } = {},
): Promise<PushedImage> {
  const address = engineAddress(docker);
  const parsed = parseImageReference(target);
  const reference = `${parsed.repository}:${parsed.tag ?? 'latest'}`;
  const auth = options.auth ?? registryAuth(parsed.registry);
  let tagged = false;
  const existed = await docker
    .getImage(reference)
    .inspect()
    .then(
      () => true,
      () => false,
    );
  if (image !== reference) {
    const { repo, tag } = splitTag(reference);
    try {
      await docker.getImage(image).tag({ repo, tag });
    } catch (error) {
      if (statusOf(error) === 404) {
        throw new NotFoundError(
          `cannot push ${image}: it is not on the Docker engine at ${address}`,
          {
            cause: error,
          },
        );
      }
      throw engineError(error, `cannot tag ${image} as ${reference}`, address);
    }
    tagged = !existed;
  }
  try {
    let stream: Readable;
    try {
      // The engine wants the header even for an open registry: then it carries no credentials.
      stream = await docker
        .getImage(reference)
        .push({ authconfig: auth ?? { serveraddress: parsed.registry } });
    } catch (error) {
      const mapped = engineError(error, `cannot push ${reference}`, address);
      if (mapped instanceof UnavailableError) throw mapped;
      throw pushError(dockerMessage(error), reference, address, error);
    }
    try {
      const digest = await followPush(stream);
      return { reference, ...(digest ? { digest } : {}) };
    } catch (error) {
      throw pushError((error as Error).message, reference, address, error);
    }
  } catch (error) {
    if (tagged) {
      await docker
        .getImage(reference)
        .remove({ noprune: true })
        .catch(() => undefined);
    }
    throw error;
  }
}
