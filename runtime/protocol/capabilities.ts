/** What a sandbox of a template may do: the `capabilities:` of `template.yaml`. */
export const CAPABILITIES = ['shell', 'files', 'code', 'ports'] as const;
export type Capability = (typeof CAPABILITIES)[number];
export const DEFAULT_CAPABILITIES: readonly Capability[] = ['shell', 'files', 'code'];

/**
 * The capability each envd route needs, by the route's first path segment (as envd's router
 * decodes it, so `//files/read` and `/%66iles/read` are `files` too): code contexts need `code`;
 * processes, terminals and the dev tools (which run programs) need `shell`; the file routes need
 * `files`; port forwarding needs `ports`. Health, info, metrics and the environment need none.
 */
const ROUTE_CAPABILITIES: ReadonlyMap<string, Capability> = new Map([
  ['execute', 'code'],
  ['contexts', 'code'],
  ['exec', 'shell'],
  ['process', 'shell'],
  ['terminal', 'shell'],
  ['dev-tools', 'shell'],
  ['files', 'files'],
  ['ports', 'ports'],
]);

/** The capability an envd route needs, from its decoded first path segment; none for the rest. */
export function capabilityOfSegment(first: string | undefined): Capability | undefined {
  return first === undefined ? undefined : ROUTE_CAPABILITIES.get(first);
}

/** The one wording of a refusal, at the gateway and in envd. */
export function capabilityRefusal(template: string, capability: Capability, what: string): string {
  return `template '${template}' does not have the ${capability} capability, so ${what} is refused; add ${capability} to its capabilities`;
}
