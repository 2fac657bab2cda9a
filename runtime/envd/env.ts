import { ENV_NAME_PATTERN } from '../protocol/arguments.js';
import { BadRequestError } from '../server/errors.js';
import { defineGroup } from '../server/route-group.js';

/**
 * The sandbox-wide environment, set after start. A sandbox handed out from the daemon's warm pool
 * was started before its caller's `envs` were known; envd's children inherit its environment, so
 * setting them here makes every later process see them.
 */
export const ENV = defineGroup('ENV', '/env', 'the environment of the sandbox’s processes', [
  {
    method: 'GET',
    path: '/env',
    summary:
      'The environment every later process of the sandbox gets, as `{ env }` (what a hibernate keeps).',
    handler: () => ({ env: { ...process.env } }),
  },
  {
    method: 'PUT',
    path: '/env',
    summary:
      'Adds variables to the environment every later process of the sandbox gets: `{ env }`.',
    handler: ({ body }) => {
      const env = (body as { env?: unknown } | undefined)?.env;
      if (typeof env !== 'object' || env === null || Array.isArray(env)) {
        throw new BadRequestError('the body must be { "env": { "NAME": "value", ... } }');
      }
      for (const [name, value] of Object.entries(env)) {
        if (!ENV_NAME_PATTERN.test(name))
          throw new BadRequestError(`${JSON.stringify(name)} is not a variable name`);
        if (typeof value !== 'string' || value.includes('\0')) {
          throw new BadRequestError(`env.${name} must be a string without NUL bytes`);
        }
      }
      Object.assign(process.env, env);
      return { set: Object.keys(env) };
    },
  },
]);
