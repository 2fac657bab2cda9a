// The same `add` command as bench/commands.ts, as a hand-written command manifest, for running
// dist/runtime/server.cjs directly on the host (no sandbox, no gateway).
module.exports = {
  version: 1,
  template: 'bench',
  commands: [
    {
      name: 'add',
      description: 'Add two numbers',
      args: [
        { name: 'x', type: 'int', required: true },
        { name: 'y', type: 'int', required: false, default: 2 },
      ],
      invoke: ({ x, y }) => x + y,
    },
  ],
};
