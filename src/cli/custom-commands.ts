import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { CustomCommand } from '../commands/custom-command.js';
import type { CommandDescription } from '../commands/discovery.js';
import { listCommands } from '../commands/list-commands.js';
import { loadTemplate } from '../commands/template.js';
import type { Sandbox } from '../sandbox/sandbox.js';

/**
 * The custom commands of a running sandbox (its template's YAML commands and its command
 * server's decorated ones) as the command model, so the shared parser, usage line, table and
 * JSON Schema work on them as on commands loaded locally.
 */
export async function sandboxCommands(sandbox: Sandbox): Promise<CustomCommand[]> {
  const described: (CommandDescription & { source: CustomCommand['source'] })[] =
    await sandbox.listCommands();
  return described.map((d) =>
    Object.assign(new CustomCommand(), {
      ...d,
      args: d.args.map((arg) => ({ ...arg })),
      template: sandbox.template,
    }),
  );
}

/**
 * The custom commands of a template on this machine: a `template.yaml` (or a template name
 * known from decorated classes) plus the decorated classes of the given compiled modules.
 */
export async function localCommands(
  template: string,
  modules: readonly string[] = [],
): Promise<CustomCommand[]> {
  const name = /\.ya?ml$/.test(template) ? loadTemplate(template) : template;
  // Importing a module runs its @sandbox decorators, which register its commands.
  for (const file of modules) await import(pathToFileURL(resolve(file)).href);
  return listCommands(name);
}
