import type { DecoratedCommand } from './command-builder.js';
import { commandRegistry } from './command-registry.js';
import { type CommandDescription, describeCommand } from './discovery.js';

/**
 * The seam between decorated classes and the in-sandbox command server, which may import no npm
 * package. A command bundle is a CommonJS module whose `module.exports` is a
 * {@link CommandManifest}: the discovery description of each command plus a plain `invoke`
 * function. The server `require`s it and needs nothing else from this package.
 */
export interface CommandManifest {
  /** Bumped when the shape changes; the server refuses versions it does not know. */
  version: 1;
  template: string;
  commands: ManifestCommand[];
}

export interface ManifestCommand extends CommandDescription {
  timeoutMs?: number;
  /** Calls the method with validated kwargs, in parameter order; may return a promise. */
  invoke(kwargs: Record<string, unknown>): unknown;
}

/**
 * The manifest for the decorated commands of a template (of every registered class when no
 * template is given). Each class is
 * instantiated once (with no constructor arguments), so state kept on `this` or at module level
 * lives from one call to the next.
 */
export function commandManifest(template?: string): CommandManifest {
  const instances = new Map<
    DecoratedCommand['cls'],
    Record<string, (...args: unknown[]) => unknown>
  >();
  const instanceOf = (cls: DecoratedCommand['cls']) => {
    let instance = instances.get(cls);
    if (!instance) {
      instance = new (cls as unknown as new () => Record<string, (...a: unknown[]) => unknown>)();
      instances.set(cls, instance);
    }
    return instance;
  };
  const registry = commandRegistry();
  const commands = (
    template === undefined ? registry.decoratedOf() : registry.decorated(template)
  ).map(
    ({ command, cls, method }): ManifestCommand => ({
      ...describeCommand(command),
      ...(command.timeoutMs === undefined ? {} : { timeoutMs: command.timeoutMs }),
      invoke: (kwargs) => {
        const instance = instanceOf(cls);
        return instance[method]?.(...command.args.map((arg) => kwargs[arg.name]));
      },
    }),
  );
  return { version: 1, template: template ?? '*', commands };
}
