import { InvalidArgumentError } from '../../errors.js';

/** The uid and gid of every sandbox user, whatever its name. */
export const SANDBOX_USER_ID = 1000;

/** What `prepare` changes in an image's account files; `undefined`: nothing to change. */
export interface AccountFiles {
  passwd?: string;
  group?: string;
}

const ROOT_PASSWD = 'root:x:0:0:root:/root:/bin/sh\n';
const ROOT_GROUP = 'root:x:0:\n';

function lines(text: string): string[] {
  return text.split('\n').filter((line) => line.length > 0);
}

/**
 * Inserts `line` for an id before the first entry that has the same id (so lookups of that id,
 * such as `id -un`, find the sandbox's name first, while the other name keeps working as an
 * alias), else at the end.
 */
function insertFor(entries: string[], id: number, line: string): string {
  const at = entries.findIndex((entry) => entry.split(':')[2] === String(id));
  const out = [...entries];
  out.splice(at < 0 ? out.length : at, 0, line);
  return `${out.join('\n')}\n`;
}

/**
 * The image's `/etc/passwd` and `/etc/group` with `user` added as uid and gid 1000, home
 * `/home/<user>`, shell `/bin/sh`; files an image lacks start with root's entry. Decisions:
 * - `user` exists with uid 1000: kept as it is (its shell and home included).
 * - uid 1000 belongs to another name (`node`, `ubuntu`...): `user` is added as a second name of
 *   uid 1000, placed before the other, so the sandbox's processes are `user` and files owned by
 *   1000 in the image stay theirs; the other name still resolves.
 * - `user` exists with another uid: refused (an InvalidArgumentError): abx sandboxes run as uid
 *   1000 and renumbering would orphan that user's files; pick another `user:` for the template.
 * The same for the group (a `user` group with another gid is left alone: the passwd entry names
 * gid 1000 whatever it is called).
 */
export function addSandboxUser(
  image: string,
  user: string,
  passwd: string | undefined,
  group: string | undefined,
): AccountFiles {
  if (!/^[a-z_][a-z0-9_-]{0,31}$/.test(user)) {
    throw new InvalidArgumentError(
      `user '${user}' is not a valid account name (lowercase letters, digits, _ and -)`,
    );
  }
  const result: AccountFiles = {};
  const users = lines(passwd ?? ROOT_PASSWD);
  const existing = users.find((line) => line.split(':')[0] === user);
  if (existing) {
    const uid = existing.split(':')[2];
    if (uid !== String(SANDBOX_USER_ID)) {
      throw new InvalidArgumentError(
        `image ${image} has a user '${user}' with uid ${uid}; abx sandboxes run as uid ${SANDBOX_USER_ID}: give the template another user name`,
      );
    }
    if (passwd === undefined) result.passwd = `${users.join('\n')}\n`;
  } else {
    result.passwd = insertFor(
      users,
      SANDBOX_USER_ID,
      `${user}:x:${SANDBOX_USER_ID}:${SANDBOX_USER_ID}::/home/${user}:/bin/sh`,
    );
  }
  const groups = lines(group ?? ROOT_GROUP);
  if (!groups.some((line) => line.split(':')[0] === user)) {
    result.group = insertFor(groups, SANDBOX_USER_ID, `${user}:x:${SANDBOX_USER_ID}:`);
  } else if (group === undefined) {
    result.group = `${groups.join('\n')}\n`;
  }
  return result;
}
