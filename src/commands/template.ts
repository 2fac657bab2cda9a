import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { LineCounter, parseDocument } from 'yaml';
import {
  CAPABILITIES,
  type Capability,
  DEFAULT_CAPABILITIES,
} from '../../runtime/protocol/capabilities.js';
import { parseDuration } from '../util/duration.js';
import { commandRegistry } from './command-registry.js';
import { type CustomCommand, TEMPLATE_NAME_PATTERN, validateCommand } from './custom-command.js';
import { TemplateError } from './errors.js';
import { checkPlaceholders, parseShellTemplate } from './shell-template.js';
import { isRecord, type Path, TemplateReader } from './template-reader.js';
import { RUNTIME_KEYS, readRuntime, type TemplateRuntime } from './template-runtime.js';

export { CAPABILITIES, type Capability, DEFAULT_CAPABILITIES };

/** The keys `template.yaml` understands today, with the keys of each custom command and arg. */
const TEMPLATE_KEYS = ['name', 'description', 'capabilities', 'custom_commands', ...RUNTIME_KEYS];
const COMMAND_KEYS = ['description', 'command', 'args', 'timeout'];
const ARG_KEYS = ['name', 'type', 'default', 'description'];

/** A loaded `template.yaml`. */
export interface TemplateSpec extends TemplateRuntime {
  name: string;
  description: string;
  capabilities: Capability[];
  /** The `custom_commands:` of the file, in file order. */
  customCommands: CustomCommand[];
  /** Where each custom command is defined, `file:line:column`, by command name. */
  places: Record<string, string>;
  /** The absolute path of the file, when loaded from one. */
  path?: string;
  /**
   * A snapshot's workspace (docs/workspaces.md, "Fork and snapshots"): the host folder its
   * sandboxes mount again at `path`, over a copy of the changes kept in the template's folder
   * (files of host uid `uid`); `since`: when its source mounted them (an apply's conflicts count
   * from it).
   */
  snapshotWorkspace?: {
    from: string;
    path: string;
    since: number;
    uid: number;
    /** An uploaded workspace's: the snapshot keeps a copy of its base (`workspace-upload/`). */
    uploaded?: { uploadId: string; since: number | null; uploadedAt: number };
  };
}

/**
 * Parses the text of a `template.yaml`. `file` names it in error messages. Throws
 * {@link TemplateError} listing every problem, each as `file:line:column: key.path: message`.
 */
export function parseTemplate(text: string, file = 'template.yaml'): TemplateSpec {
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, prettyErrors: false, uniqueKeys: true });
  if (doc.errors.length > 0) {
    const [first, ...rest] = doc.errors.map((error) => {
      const { line, col } = lines.linePos(error.pos[0]);
      return { location: `${file}:${line}:${col}`, message: error.message.split('\n')[0] };
    });
    throw new TemplateError(
      [
        `invalid YAML: ${first?.message}`,
        ...rest.map((e) => `${e.location}: invalid YAML: ${e.message}`),
      ].join('\n'),
      first?.location,
    );
  }
  const reader = new TemplateReader(file, doc, lines);
  let root: unknown;
  try {
    root = doc.toJS();
  } catch (error) {
    throw new TemplateError(`cannot read YAML: ${(error as Error).message}`, `${file}:1:1`, {
      cause: error,
    });
  }
  if (!isRecord(root)) {
    throw new TemplateError(
      'a template is a mapping with at least `name:`, such as `name: data-tools`',
      `${file}:1:1`,
    );
  }
  reader.checkKeys(root, TEMPLATE_KEYS, []);

  const name = root.name;
  if (typeof name !== 'string' || !TEMPLATE_NAME_PATTERN.test(name)) {
    reader.problem(
      ['name'],
      name === undefined
        ? 'missing; every template needs a name, such as `name: data-tools`'
        : 'must be a name of letters, digits, ".", "_" and "-", such as data-tools',
    );
  }
  const description = root.description ?? '';
  if (typeof description !== 'string') reader.problem(['description'], 'must be a string');

  const capabilities = readCapabilities(reader, root.capabilities);
  const { commands, places } = readCommands(reader, root.custom_commands, String(name));
  const runtime = readRuntime(reader, root, dirname(resolve(file)));
  if (reader.problems.length > 0) {
    const [first, ...rest] = reader.problems;
    throw new TemplateError(
      [first?.text.slice(first.location.length + 2), ...rest.map((p) => p.text)].join('\n'),
      first?.location,
    );
  }
  return {
    name: name as string,
    description: description as string,
    capabilities,
    customCommands: commands,
    places,
    ...runtime,
  };
}

function readCapabilities(reader: TemplateReader, value: unknown): Capability[] {
  if (value === undefined || value === null) return [...DEFAULT_CAPABILITIES];
  if (!Array.isArray(value)) {
    reader.problem(
      ['capabilities'],
      `must be a list, such as [${DEFAULT_CAPABILITIES.join(', ')}]`,
    );
    return [];
  }
  const result: Capability[] = [];
  value.forEach((item, index) => {
    if (!CAPABILITIES.includes(item)) {
      reader.problem(['capabilities', index], `must be one of ${CAPABILITIES.join(', ')}`);
    } else if (!result.includes(item)) {
      result.push(item);
    }
  });
  return result;
}

function readCommands(
  reader: TemplateReader,
  value: unknown,
  template: string,
): { commands: CustomCommand[]; places: Record<string, string> } {
  const commands: CustomCommand[] = [];
  const places: Record<string, string> = {};
  if (value === undefined || value === null) return { commands, places };
  if (!isRecord(value)) {
    reader.problem(['custom_commands'], 'must be a mapping of command name → definition');
    return { commands, places };
  }
  for (const [name, entry] of Object.entries(value)) {
    const path = ['custom_commands', name];
    if (!isRecord(entry)) {
      reader.problem(path, 'must be a mapping with at least `command:`');
      continue;
    }
    reader.checkKeys(entry, COMMAND_KEYS, path);
    const args = readArgs(reader, entry.args, [...path, 'args']);
    let timeoutMs: number | undefined;
    if (entry.timeout !== undefined) {
      timeoutMs =
        typeof entry.timeout === 'string' || typeof entry.timeout === 'number'
          ? parseDuration(entry.timeout)
          : undefined;
      if (timeoutMs === undefined) {
        reader.problem([...path, 'timeout'], 'must be a duration such as 30s, 5m or 1h');
      }
    }
    if (entry.command === undefined) {
      reader.problem(path, 'missing `command:`, the shell command to run');
      continue;
    }
    const { command, issues } = validateCommand({
      name,
      description: entry.description ?? '',
      args,
      template,
      source: 'yaml',
      command: entry.command,
      ...(timeoutMs === undefined ? {} : { timeoutMs }),
    });
    for (const issue of issues) {
      const keyPath = issue.path === 'name' ? path : [...path, ...parseModelPath(issue.path)];
      reader.problem(
        keyPath,
        issue.path === 'name' ? `command name ${issue.message}` : issue.message,
      );
    }
    if (!command) continue;
    const placeholderProblems = checkPlaceholders(
      parseShellTemplate(command.command as string),
      command.args.map((a) => a.name),
    );
    for (const problem of placeholderProblems) reader.problem([...path, 'command'], problem);
    commands.push(command);
    places[name] = reader.locateKey(path);
  }
  return { commands, places };
}

function parseModelPath(path: string): Path {
  return path
    .split(/\.|\[(\d+)\]/)
    .filter((part) => part !== undefined && part !== '')
    .map((part) => (/^\d+$/.test(part) ? Number(part) : part));
}

/** An arg without `type:` takes it from its default, as an unannotated parameter does. */
function inferType(value: unknown): unknown {
  if (typeof value === 'number') return Number.isInteger(value) ? 'int' : 'float';
  if (typeof value === 'boolean') return 'bool';
  return 'str';
}

function readArgs(reader: TemplateReader, value: unknown, path: Path): Record<string, unknown>[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) {
    reader.problem(path, 'must be a list of arguments, such as [{ name: path, type: str }]');
    return [];
  }
  return value.map((item, index) => {
    if (!isRecord(item)) {
      reader.problem([...path, index], 'must be a mapping with at least `name:`');
      return { name: `#${index}` };
    }
    reader.checkKeys(item, ARG_KEYS, [...path, index]);
    if (item.name === undefined) reader.problem([...path, index], 'missing `name:`');
    return {
      name: item.name,
      type: item.type ?? inferType(item.default),
      required: !('default' in item),
      ...('default' in item ? { default: item.default } : {}),
      ...('description' in item ? { description: item.description } : {}),
    };
  });
}

/**
 * Loads a `template.yaml` (see {@link parseTemplate} for errors) and makes it known by name, so
 * that `listCommands('its-name')` includes its custom commands.
 */
export function loadTemplate(path: string): TemplateSpec {
  const absolute = resolve(path);
  let text: string;
  try {
    text = readFileSync(absolute, 'utf8');
  } catch (error) {
    throw new TemplateError(`cannot read template: ${(error as Error).message}`, path, {
      cause: error,
    });
  }
  const template = { ...parseTemplate(text, path), path: absolute };
  commandRegistry().registerTemplate(template);
  return template;
}
