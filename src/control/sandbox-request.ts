import { ENV_NAME_PATTERN } from '../../runtime/protocol/arguments.js';
import { MAX_SANDBOX_TIMEOUT_MS } from '../../runtime/protocol/constants.js';
import { type EgressPolicy, normalizePolicy, PolicyError } from '../egress/policy.js';
import { InvalidArgumentError } from '../errors.js';

/** What `POST /v1/sandboxes` takes. */
export interface CreateSandboxRequest {
  template?: string;
  timeoutMs?: number;
  envs?: Record<string, string>;
  metadata?: Record<string, string>;
  /** The sandbox's egress policy: the `internet` network with these lists (docs/network.md). */
  network?: unknown;
  /** E2B's switch: true gives the `internet` network; false denies every address. */
  allowInternetAccess?: unknown;
  /** True: its timeout pauses it instead of killing it (E2B's `autoPause`). */
  autoPause?: unknown;
  /** With `autoPause`: keep its memory (freeze, the default) or only its disk (hibernate). */
  autoPauseMemory?: unknown;
  /** With `autoPause`: a request for it through the gateway resumes it (E2B's `autoResume`). */
  autoResume?: unknown;
  /** Volumes to mount: `[{ name, path, readOnly? }]` (docs/volumes.md). */
  volumeMounts?: unknown;
  /** A host folder mounted copy-on-write: `{ from, path? }` (docs/workspaces.md). */
  workspace?: unknown;
}

/**
 * What a create's timeout does: `{ onTimeout: 'pause', keepMemory }` with `autoPause: true`
 * (`keepMemory` from `autoPauseMemory`, else `defaultMemory`); null without it.
 */
export function checkLifecycle(
  request: Pick<CreateSandboxRequest, 'autoPause' | 'autoPauseMemory' | 'autoResume'>,
  defaultMemory: boolean,
): { onTimeout: 'pause'; keepMemory: boolean; autoResume?: boolean } | null {
  const { autoPause, autoPauseMemory, autoResume } = request;
  if (autoResume !== undefined && autoResume !== null && typeof autoResume !== 'boolean') {
    throw new InvalidArgumentError(
      `autoResume must be true or false, not ${JSON.stringify(autoResume)}`,
    );
  }
  if (autoPause !== undefined && autoPause !== null && typeof autoPause !== 'boolean') {
    throw new InvalidArgumentError(
      `autoPause must be true or false, not ${JSON.stringify(autoPause)}`,
    );
  }
  if (
    autoPauseMemory !== undefined &&
    autoPauseMemory !== null &&
    typeof autoPauseMemory !== 'boolean'
  ) {
    throw new InvalidArgumentError(
      `autoPauseMemory must be true (freeze: keep its memory) or false (hibernate: keep its disk), not ${JSON.stringify(autoPauseMemory)}`,
    );
  }
  if (autoPause !== true) {
    if (typeof autoPauseMemory === 'boolean') {
      throw new InvalidArgumentError('autoPauseMemory needs autoPause: true');
    }
    if (autoResume === true) {
      throw new InvalidArgumentError(
        'autoResume needs autoPause: true (a sandbox that pauses at its timeout is what its traffic resumes)',
      );
    }
    return null;
  }
  return {
    onTimeout: 'pause',
    keepMemory: typeof autoPauseMemory === 'boolean' ? autoPauseMemory : defaultMemory,
    ...(autoResume === true ? { autoResume: true } : {}),
  };
}

/**
 * `network`: `{ allowOut?, denyOut?, rules?, egressProxy? }` (CIDRs, domain names, `*.`
 * wildcards; per-host header rules; the user's SOCKS5 proxy, docs/network.md), canonical;
 * undefined when absent. A bad entry is an InvalidArgumentError naming it.
 */
export function checkNetworkPolicy(value: unknown, name = 'network'): EgressPolicy | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidArgumentError(
      `${name} must be an object { allowOut?, denyOut? } of CIDRs, domain names and *.domain wildcards`,
    );
  }
  const { allowOut, denyOut, rules, egressProxy, ...rest } = value as Record<string, unknown>;
  const unknown = Object.keys(rest);
  if (unknown.length > 0) {
    throw new InvalidArgumentError(
      `${name}.${unknown[0]} is not a network key (allowOut, denyOut, rules, egressProxy)`,
    );
  }
  try {
    return normalizePolicy(
      {
        allowOut: (allowOut ?? []) as string[],
        denyOut: (denyOut ?? []) as string[],
        ...(rules === undefined || rules === null ? {} : { rules: rules as never }),
        ...(egressProxy === undefined || egressProxy === null
          ? {}
          : { egressProxy: egressProxy as never }),
      },
      name,
    );
  } catch (error) {
    if (error instanceof PolicyError) throw new InvalidArgumentError(error.message);
    throw error;
  }
}

/** `envs`: a map of variable names to values a process environment can hold. */
export function checkEnvs(value: unknown): Record<string, string> {
  const envs = checkStringMap('envs', value);
  for (const [key, item] of Object.entries(envs)) {
    if (!ENV_NAME_PATTERN.test(key)) {
      throw new InvalidArgumentError(
        `envs.${key} is not a variable name: use letters, digits and _, not starting with a digit`,
      );
    }
    if (item.includes('\0')) throw new InvalidArgumentError(`envs.${key} holds a NUL byte`);
  }
  return envs;
}

/** An object whose values are all strings (`metadata`, `envs`); `{}` when absent. */
export function checkStringMap(name: string, value: unknown): Record<string, string> {
  if (value === undefined) return {};
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new InvalidArgumentError(`${name} must be an object of string values`);
  }
  for (const [key, item] of Object.entries(value)) {
    if (typeof item !== 'string') {
      throw new InvalidArgumentError(`${name}.${key} must be a string, not ${typeof item}`);
    }
  }
  return value as Record<string, string>;
}

/** A sandbox's lifetime in milliseconds: a whole number from 1 to 24 h. */
export function checkTimeout(timeoutMs: unknown): number {
  if (
    typeof timeoutMs !== 'number' ||
    !Number.isSafeInteger(timeoutMs) ||
    timeoutMs <= 0 ||
    timeoutMs > MAX_SANDBOX_TIMEOUT_MS
  ) {
    throw new InvalidArgumentError(
      `timeoutMs must be a whole number of milliseconds between 1 and ${MAX_SANDBOX_TIMEOUT_MS} (24 h), not ${JSON.stringify(timeoutMs)}`,
    );
  }
  return timeoutMs;
}
