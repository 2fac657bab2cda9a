/**
 * Where the egress process's questions for secret values are answered. The egress controller is
 * made inside a provider (one process per provider), while the secrets and the sandboxes' owners
 * are the daemon's: each daemon registers a resolver here, which answers for the sandboxes it
 * knows (undefined: not one of mine) and the controller asks them in turn.
 */
export type SecretResolver = (
  sandboxId: string,
  name: string,
) => Promise<{ value: string | undefined } | undefined>;

const resolvers = new Set<SecretResolver>();

/** Registers a daemon's resolver; the function it returns removes it (the daemon's stop). */
export function registerSecretResolver(resolver: SecretResolver): () => void {
  resolvers.add(resolver);
  return () => resolvers.delete(resolver);
}

/**
 * The current value of the secret `name` for the sandbox `sandboxId`, undefined when it has none
 * (or no daemon here knows the sandbox): the request then fails closed.
 */
export async function resolveSecretFor(
  sandboxId: string,
  name: string,
): Promise<string | undefined> {
  for (const resolver of resolvers) {
    const answer = await resolver(sandboxId, name);
    if (answer) return answer.value;
  }
  return undefined;
}
