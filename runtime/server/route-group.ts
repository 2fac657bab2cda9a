import type { ServerContext } from './context.js';
import type { Route } from './route-table.js';

/** The route groups a server can enable; CORE (health, info) is always on. */
export const GROUP_NAMES = [
  'CORE',
  'COMMANDS',
  'FILE_OPS',
  'PROCESS',
  'SYSTEM',
  'TERMINAL',
  'DEV_TOOLS',
  'BROWSER',
] as const;
export type GroupName = (typeof GROUP_NAMES)[number];

/** A route of the server, handed the server's context. */
export type ServerRoute = Route<ServerContext>;

/** A named set of routes under one path prefix, enabled or disabled together. */
export interface RouteGroup {
  /** One of {@link GROUP_NAMES} for the command server; envd adds groups of its own. */
  name: string;
  /** Every route of the group starts with it (`/files`); CORE's routes sit at the root. */
  prefix: string;
  description: string;
  routes: ServerRoute[];
}

/** Builds a group, stamping its name on each route and checking each sits under the prefix. */
export function defineGroup(
  name: string,
  prefix: string,
  description: string,
  routes: Omit<ServerRoute, 'group'>[],
): RouteGroup {
  for (const route of routes) {
    if (route.path !== prefix && !route.path.startsWith(`${prefix}/`)) {
      throw new Error(`route ${route.method} ${route.path} of ${name} is not under ${prefix}`);
    }
  }
  return { name, prefix, description, routes: routes.map((r) => ({ ...r, group: name })) };
}

/**
 * Parses `--groups files,process` (group names or their prefixes, any case, `-` or `_`). CORE is
 * added: a server without health would look dead.
 */
export function parseGroups(text: string, groups: readonly RouteGroup[]): Set<string> {
  const wanted = new Set<string>(['CORE']);
  for (const word of text
    .split(',')
    .map((w) => w.trim())
    .filter(Boolean)) {
    const key = word.toUpperCase().replaceAll('-', '_');
    const group = groups.find(
      (g) => g.name === key || g.prefix.slice(1).toUpperCase().replaceAll('-', '_') === key,
    );
    if (!group) {
      throw new Error(
        `unknown route group '${word}'; known groups: ${groups.map((g) => g.name.toLowerCase()).join(', ')}`,
      );
    }
    wanted.add(group.name);
  }
  return wanted;
}
