import { BadRequestError } from '../server/errors.js';
import { defineGroup } from '../server/route-group.js';

/** What a token may be: 32 to 512 characters of base64, base64url or hex, nothing else. */
const TOKEN_PATTERN = /^[A-Za-z0-9+/_=-]{32,512}$/;

/**
 * The token replacement of a pre-started envd. A pod of an agent-sandbox warm pool starts from a
 * template shared by every pod of the pool, so it starts with the template's bootstrap tokens;
 * when a claim hands it to one sandbox, the control plane gives it that sandbox's own, once.
 * After that the bootstrap tokens are refused, and the route answers 400 to any further call.
 */
export function tokensGroup(replace: (tokens: { client: string; control: string }) => void) {
  let replaced = false;
  return defineGroup('TOKENS', '/tokens', 'replacing the bootstrap tokens, once', [
    {
      method: 'PUT',
      path: '/tokens',
      control: true,
      summary:
        'Replaces envd’s tokens with `{ client, control }`, once; the old ones are refused from the next request on. Control token only.',
      handler: ({ body }) => {
        if (replaced) {
          throw new BadRequestError(
            "this envd's tokens were replaced already; it takes one replacement",
          );
        }
        const { client, control } = (body ?? {}) as { client?: unknown; control?: unknown };
        for (const [name, value] of [
          ['client', client],
          ['control', control],
        ] as const) {
          if (typeof value !== 'string' || !TOKEN_PATTERN.test(value)) {
            throw new BadRequestError(
              `${name} must be a token of 32 to 512 characters of base64, base64url or hex`,
            );
          }
        }
        if (client === control) {
          throw new BadRequestError('client and control must be different tokens');
        }
        replace({ client: client as string, control: control as string });
        replaced = true;
        return { replaced: true };
      },
    },
  ]);
}
