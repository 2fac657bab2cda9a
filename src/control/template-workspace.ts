/**
 * A template's workspace (`workspace:` in its template.yaml; docs/workspaces.md, "From a
 * template and from E2B's SDK"): a create that names none mounts the template's, checked and
 * authorized exactly as its own would be, for the key (and local user) that creates.
 */

/**
 * Runs a create's workspace check (or authorization, sync or async); when the workspace is the
 * template's (the create naming none), a refusal names the template too, so that a key told no
 * for a folder it never named learns where it came from.
 */
export function templateWorkspace<T>(
  own: unknown,
  spec: { name: string; workspace?: unknown },
  check: () => T,
): T {
  const named = (error: unknown): unknown => {
    if ((own === undefined || own === null) && spec.workspace && error instanceof Error) {
      error.message = `template '${spec.name}' mounts a workspace (workspace: in its template.yaml; a create's own workspace replaces it): ${error.message}`;
    }
    return error;
  };
  let result: T;
  try {
    result = check();
  } catch (error) {
    throw named(error);
  }
  if (result instanceof Promise) {
    return result.catch((error: unknown) => {
      throw named(error);
    }) as T;
  }
  return result;
}
