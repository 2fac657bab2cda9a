import { defineGroup } from '../route-group.js';

/** The command contract of DESIGN.md: discovery and calls of built-in and loaded commands. */
export const COMMANDS = defineGroup('COMMANDS', '/commands', 'list, describe and call commands', [
  {
    method: 'GET',
    path: '/commands',
    summary: 'Every command with its argument schema: `{"commands":[{name,description,args}]}`.',
    handler: ({ ctx }) => ({ commands: ctx.commands.list() }),
  },
  {
    method: 'GET',
    path: '/commands/{name}',
    summary: 'One command with its argument schema.',
    handler: ({ ctx, params }) => ctx.commands.describe(params.name ?? ''),
  },
  {
    method: 'POST',
    path: '/commands/{name}',
    summary: 'Calls a command with a JSON kwargs body; answers `{"result": ...}`.',
    handler: ({ ctx, params, body }) => ctx.commands.call(params.name ?? '', body),
  },
]);
