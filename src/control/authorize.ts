import { createHash, timingSafeEqual } from 'node:crypto';
import { capabilityRefusal } from '../../runtime/protocol/capabilities.js';
import { ENVD_PORT } from '../../runtime/protocol/constants.js';
import { E2B_CODE_PORT } from '../compat/e2b/code-interpreter.js';
import {
  AuthenticationError,
  CapabilityError,
  PermissionDeniedError,
  type SandboxError,
  SandboxNotFoundError,
  SandboxPausedError,
} from '../errors.js';
import type { RequestTarget } from './gateway-connection.js';
import { type PortLinks, SESSION_COOKIE } from './gateway-links.js';
import { sandboxToken, tokenMatches } from './ids.js';
import type { SandboxRecord } from './registry.js';

/**
 * Who may reach what through the gateway, in one place: a pure function of the request's target
 * (read from its head alone), the sandbox's record, whether its processes run, and the time. The
 * native routes, E2B's face, ports, links and signed URLs are all decided here. A connection may
 * keep a decision for its next requests only under the {@link AccessGrant.key} this module gives
 * it, and only until {@link AccessGrant.until}: the key holds everything the decision read from
 * the request (docs/security.md, "Cached decisions").
 */

/** What a request may do: where it goes, with which token, and how long that holds. */
export interface AccessGrant {
  allow: true;
  /** The sandbox's own token, which envd is given for this request. */
  token: string;
  /**
   * envd's socket (envd's port, or E2B's code interpreter); root's envd (`envd-root`: a native
   * request with `X-Abx-User: root` to a sandbox that allows root); or a port the sandbox serves.
   */
  reach: 'envd' | 'envd-root' | 'port';
  /**
   * The next request on the connection may reuse this decision when {@link accessKey} of its
   * target is this string. Undefined: never reused (a signed URL, a link, a local answer).
   */
  key: string | undefined;
  /** Ms since the epoch after which the decision must be made again (a session cookie's end). */
  until: number;
}

/** A request whose credential holds for a paused sandbox that resumes on traffic: resume it, then decide again. */
export interface AccessResume {
  allow: 'resume';
}

/** Why a request is refused, as the client reads it. */
export interface AccessRefusal {
  allow: false;
  error: SandboxError;
}

export type AccessDecision = AccessGrant | AccessResume | AccessRefusal;

/** What {@link authorize} reads besides the target. */
export interface AccessFacts {
  /** The sandbox's record, any state; undefined when none has that id. */
  record: SandboxRecord | undefined;
  /** True while the sandbox's processes run (asked only of a record in state `running`). */
  alive: boolean;
  /** Ms since the epoch. */
  now: number;
  /** The installation's links and cookies (its token secret); undefined: none are honoured. */
  links: PortLinks | undefined;
  /** The gateway resumes a paused sandbox made with `autoResume` on its traffic. */
  resumes: boolean;
}

/** The refusal of a request to a paused sandbox (409), saying how to resume it. */
export function pausedError(id: string): SandboxPausedError {
  return new SandboxPausedError(
    `sandbox ${id} is paused: resume it first (sandbox.resume() or Sandbox.connect('${id}') in the SDK, abx resume ${id}, or POST /v1/sandboxes/${id}/resume on the daemon's API)`,
    { code: 'paused' },
  );
}

/** The key of the route to the daemon's API (see {@link accessKeyParts}). */
export const API_ACCESS_KEY = JSON.stringify(['api']);

/**
 * The key a decision about `target` is kept under on a connection, or undefined when it is never
 * kept: {@link accessKeyParts}, as one string.
 */
export function accessKey(target: RequestTarget): string | undefined {
  const parts = accessKeyParts(target);
  return parts === undefined ? undefined : JSON.stringify(parts);
}

/**
 * Every part of a target that {@link authorize} reads: the kind of credential (a bearer token,
 * whatever carried it, or a session cookie), the sandbox, the port, whether E2B's face serves it
 * (which decides E2B's code port), and the credential's text. Scoped credentials (signed URLs,
 * one-time links) and the gateway's own answers have none: they are decided on every request.
 * The authorization test removes each part in turn and finds two requests that would then share
 * a decision they must not.
 */
export function accessKeyParts(target: RequestTarget): string[] | undefined {
  // The daemon's API checks its own keys on every request: the gateway only routes it there.
  if (target.api) return ['api'];
  if (target.local !== undefined) return undefined;
  let credential: [kind: string, text: string];
  if (target.via === 'header' || target.via === 'authorization' || target.via === 'query') {
    if (target.token === undefined) return undefined;
    credential = ['token', target.token];
  } else if (target.via === 'session' && target.session !== undefined) {
    credential = ['session', target.session];
  } else {
    return undefined;
  }
  const face = target.e2b === true ? 'e2b' : 'native';
  const user = target.root === true ? 'root' : 'user';
  return [credential[0], target.id, String(target.port), face, user, credential[1]];
}

/** Decides `target` (see the module's comment). */
export function authorize(target: RequestTarget, facts: AccessFacts): AccessDecision {
  const { record, links, now } = facts;
  const { id, port } = target;
  const refuse = (error: SandboxError): AccessRefusal => ({ allow: false, error });
  // The credential first: nothing about the sandbox's state is said to a caller without one.
  if (!record) return refuse(new SandboxNotFoundError(`sandbox ${id} does not exist`));
  let until = Number.POSITIVE_INFINITY;
  let token: string;
  if (target.via === 'header' || target.via === 'authorization' || target.via === 'query') {
    if (!tokenMatches(target.token, record.tokenHash)) {
      return refuse(
        new AuthenticationError(
          `missing or wrong access token for sandbox ${id}: send X-Access-Token (or ?token=, or Authorization: Bearer)`,
        ),
      );
    }
    token = target.token as string;
  } else {
    if (!links) {
      return refuse(
        new AuthenticationError(
          `this gateway takes no browser links or signed URLs: send X-Access-Token with sandbox ${id}'s token`,
        ),
      );
    }
    token = sandboxToken(links.secret, id);
    if (target.via === 'session') {
      const ends = links.sessionEnds(target.session ?? '', id, port, now);
      if (ends === undefined) {
        return refuse(
          new AuthenticationError(
            `the ${SESSION_COOKIE} cookie is not valid for port ${port} of sandbox ${id} (expired, or for another sandbox or port): open a new link (sandbox.getSignedUrl, abx url) or send X-Access-Token`,
          ),
        );
      }
      until = ends;
    } else if (target.via === 'signature') {
      const wrong = fileSignatureRefusal(
        target.signed as NonNullable<RequestTarget['signed']>,
        token,
        now,
      );
      if (wrong) return refuse(wrong);
    }
    // via 'link': the link itself is checked, and spent, where it is redeemed (PortLinks.redeem).
  }
  if (record.state === 'paused') {
    return facts.resumes && record.lifecycle?.autoResume
      ? { allow: 'resume' }
      : refuse(pausedError(id));
  }
  if (record.state !== 'running' || !facts.alive) {
    return refuse(
      new SandboxNotFoundError(
        `sandbox ${id} is not running (${record.state === 'running' ? 'its processes ended' : `${record.state}: ${record.endReason}`})`,
      ),
    );
  }
  const key = accessKey(target);
  const grant = (reach: AccessGrant['reach']): AccessGrant => ({
    allow: true,
    token,
    reach,
    key,
    until,
  });
  if (port === ENVD_PORT) {
    if (target.local) {
      return refuse(
        new PermissionDeniedError(
          `envd's port ${ENVD_PORT} is not opened to browsers: links are for ports the sandbox serves`,
        ),
      );
    }
    if (target.root) {
      if (!record.handle.envdRootSocket) {
        return refuse(
          new PermissionDeniedError(
            `sandbox ${id} has no root: its template does not allow root (allow_root: true in an image template, on the local provider with a root daemon; docs/security.md); leave X-Abx-User out to run as its user`,
            { code: 'root_not_allowed' },
          ),
        );
      }
      return grant('envd-root');
    }
    return grant('envd');
  }
  if (target.e2b && port === E2B_CODE_PORT) {
    // E2B's code interpreter is envd's code contexts, reached over envd's socket.
    if (!record.capabilities.includes('code')) {
      return refuse(
        new CapabilityError(
          capabilityRefusal(
            record.template,
            'code',
            `E2B's code interpreter (port ${port}) of sandbox ${id}`,
          ),
        ),
      );
    }
    return grant('envd');
  }
  if (!record.capabilities.includes('ports')) {
    return refuse(
      new CapabilityError(
        capabilityRefusal(record.template, 'ports', `reaching port ${port} of sandbox ${id}`),
      ),
    );
  }
  return grant('port');
}

/**
 * Checks a signed URL as E2B's envd does: `v1_` and the unpadded base64 SHA-256 of
 * `path:operation:user:token[:expiration]`, with an expiration in Unix seconds not past.
 * Undefined when it holds.
 */
function fileSignatureRefusal(
  signed: NonNullable<RequestTarget['signed']>,
  token: string,
  now: number,
): AuthenticationError | undefined {
  const { expiration } = signed;
  if (expiration !== undefined && !/^\d{1,12}$/.test(expiration)) {
    return new AuthenticationError(
      `invalid signature_expiration: ${JSON.stringify(expiration.slice(0, 40))} is not a Unix time in seconds`,
    );
  }
  const raw = `${signed.path}:${signed.operation}:${signed.user}:${token}${expiration === undefined ? '' : `:${expiration}`}`;
  const expected = `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
  const given = Buffer.from(signed.signature);
  if (given.length !== expected.length || !timingSafeEqual(given, Buffer.from(expected))) {
    return new AuthenticationError(
      `invalid signature: it does not match this ${signed.operation === 'write' ? 'upload' : 'download'} of ${JSON.stringify(signed.path.slice(0, 200))}: sign the URL with the sandbox's access token (sandbox.${signed.operation === 'write' ? 'uploadUrl' : 'downloadUrl'})`,
    );
  }
  if (expiration !== undefined && Number(expiration) * 1000 < now) {
    // E2B's envd's own words, which its SDKs' users match on.
    return new AuthenticationError('signature is already expired');
  }
  return undefined;
}
