import { SANDBOX_RUN_DIR } from '../protocol/constants.js';

/** Root's envd in a root-allowing sandbox: the daemon sends `user: 'root'` requests here. */
export const ENVD_ROOT_SOCKET = `${SANDBOX_RUN_DIR}/envd-root.sock`;
/** The `sudo` shim's way to root (see sudo-server.ts). */
export const SUDO_SOCKET = `${SANDBOX_RUN_DIR}/sudo.sock`;
/** The uid and gid of the sandbox's default user inside its user namespace. */
export const DEFAULT_UID = 1000;
