/**
 * Command-line prefixes the root tests use to run something as another host uid or in a mount
 * namespace of its own (so that its mounts never reach the host's table).
 */

/** `setpriv` options that run the command after them as host `uid` (gid the same, no groups). */
export function asHostUid(uid: number): [string, ...string[]] {
  return ['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups'];
}

/**
 * `unshare` that runs the shell `script` in a new mount namespace whose mounts stay there
 * (propagation private); `$0` is `name`, `$1`… are `args` (the script usually ends with
 * `exec "$@"` after shifting off its own).
 */
export function inPrivateMounts(
  script: string,
  name: string,
  args: readonly string[],
): [string, ...string[]] {
  return [
    'unshare',
    '--mount',
    '--propagation',
    'private',
    '--',
    '/bin/sh',
    '-c',
    script,
    name,
    ...args,
  ];
}

/** The script that bind-mounts `$1` over `$2`, then runs the rest. */
export const BIND_THEN_EXEC = 'mount --bind "$1" "$2" && shift 2 && exec "$@"';
