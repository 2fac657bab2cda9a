/**
 * Numbers, names and paths both sides of the wire agree on. Built-ins only (none needed).
 */

/** The port envd answers on: the gateway routes `{ENVD_PORT}-{sandboxId}.{domain}` to it. */
export const ENVD_PORT = 49983;

/** Names the sandbox when the Host header cannot (`X-Sandbox-Id` with `X-Sandbox-Port`). */
export const SANDBOX_ID_HEADER = 'x-sandbox-id';
/** The port of the sandbox a request is for, with {@link SANDBOX_ID_HEADER}. */
export const SANDBOX_PORT_HEADER = 'x-sandbox-port';
/** The sandbox's access token, which the gateway checks (or `?token=`). */
export const ACCESS_TOKEN_HEADER = 'x-access-token';
/**
 * `root` sends a native request for envd to root's envd, where the sandbox's template allows
 * root (the gateway refuses it elsewhere); `user` or none: the sandbox's user.
 */
export const SANDBOX_USER_HEADER = 'x-abx-user';
/**
 * A local client's file named by descriptor (`PID/FD`) on a native `PUT /files/write` or
 * `GET /files/read` without a body: the gateway copies between it and the sandbox's file itself
 * (src/control/local-handoff.ts), or refuses with {@link LOCAL_FILE_UNAVAILABLE}.
 */
export const LOCAL_FILE_HEADER = 'x-abx-local-file';
/** The `code` of a refused handoff: the client sends the bytes instead. */
export const LOCAL_FILE_UNAVAILABLE = 'local_file_unavailable';
/** envd's `GET /files/archive`: the bytes of the files the archive will hold, before it is sent. */
export const ARCHIVE_SIZE_HEADER = 'x-archive-size';

/** The sandbox user's home, and the default working directory. */
export const SANDBOX_HOME = '/home/user';
/** Where the runtime (envd, the command server) is mounted read-only in every sandbox. */
export const SANDBOX_RUNTIME_DIR = '/opt/abx';
/** envd's socket and the per-port sockets live here, in the sandbox's own small tmpfs. */
export const SANDBOX_RUN_DIR = '/run/abx';

/** envd's front in the runtime folder: a static program (native/envd-front), executable. */
export const ENVD_FRONT_NAME = 'envd-front';
/** The command server's state files (`server-<port>.json`), so any client can find a server. */
export const SERVER_STATE_DIR = `${SANDBOX_HOME}/.abx/server`;

/**
 * Where a command bundle finds agent-sandbox's authoring half (`globalThis[Symbol.for(...)]`): the
 * command server loads it before the bundle (`--authoring`), so bundles carry only their own code.
 */
export const AUTHORING_GLOBAL_KEY = 'agent-sandbox.authoring';
/** The authoring half as the runtime ships it, next to `server.cjs` (`dist/runtime/authoring.cjs`). */
export const RUNTIME_AUTHORING_FILE = 'authoring.cjs';

/** The longest lifetime a sandbox may be given: 24 hours. */
export const MAX_SANDBOX_TIMEOUT_MS = 24 * 3_600_000;
