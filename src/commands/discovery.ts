import type { CommandDescription } from '../../runtime/protocol/wire.js';
import type { CustomCommand } from './custom-command.js';

export type { CommandDescription };

/** A command in the wire shape of `GET /commands`, without where it comes from. */
export function describeCommand(command: CustomCommand): CommandDescription {
  return {
    name: command.name,
    description: command.description,
    args: command.args.map((arg) => ({
      name: arg.name,
      type: arg.type,
      required: arg.required,
      ...(arg.default === undefined ? {} : { default: arg.default }),
      ...(arg.description === undefined ? {} : { description: arg.description }),
    })),
  };
}

function formatArg(arg: CommandDescription['args'][number]): string {
  return arg.required
    ? `${arg.name}: ${arg.type}`
    : `${arg.name}: ${arg.type} = ${JSON.stringify(arg.default)}`;
}

/** A plain-text table of commands: name, source, arguments with types and defaults, description. */
export function formatCommandTable(commands: readonly CustomCommand[]): string {
  const rows = [
    ['NAME', 'SOURCE', 'ARGUMENTS', 'DESCRIPTION'],
    ...commands.map((command) => [
      command.name,
      command.source,
      describeCommand(command).args.map(formatArg).join(', ') || '-',
      command.description || '-',
    ]),
  ];
  const widths = rows[0]?.map((_, column) =>
    Math.max(...rows.map((row) => row[column]?.length ?? 0)),
  );
  return rows
    .map((row) =>
      row
        .map((cell, column) =>
          column === row.length - 1 ? cell : cell.padEnd(widths?.[column] ?? 0),
        )
        .join('  '),
    )
    .join('\n');
}
