import { Reply } from '../http.js';
import { defineGroup } from '../route-group.js';

/** Health, identity, what the server can do, and a remote stop. Always enabled. */
export const CORE = defineGroup('CORE', '', 'health, server info, capabilities, shutdown', [
  {
    method: 'GET',
    path: '/health',
    summary: 'Liveness: `{"status":"ok"}`; needs no token.',
    public: true,
    handler: () => ({ status: 'ok' }),
  },
  {
    method: 'GET',
    path: '/info',
    summary: 'Server name, pid, node version, address, uptime, enabled groups, command count.',
    handler: ({ ctx }) => ctx.info(),
  },
  {
    method: 'GET',
    path: '/capabilities',
    summary: 'The enabled route groups with their endpoints.',
    handler: ({ ctx }) => ({
      capabilities: ctx.enabledGroups.map((group) => ({
        name: group.name,
        prefix: group.prefix,
        description: group.description,
        endpoints: group.routes.map(({ method, path, summary }) => ({ method, path, summary })),
      })),
    }),
  },
  {
    method: 'POST',
    path: '/shutdown',
    summary: 'Stops the server gracefully once the calls in flight finish; answers 202.',
    handler: ({ ctx }) => {
      ctx.requestShutdown();
      return new Reply(202, { status: 'stopping' });
    },
  },
]);
