import { resolve } from 'node:path';
import { stringify } from 'yaml';
import { shellQuote } from '../util/shell-quote.js';
import type { Capability } from './template.js';

/** A `setup:` entry as `template.yaml` writes it. */
type StepDocument =
  | string
  | { run: string; user?: string }
  | { copy: string; to: string; user?: string };

/** The keys of a `template.yaml`, as the builder fills them (the YAML spelling). */
interface TemplateDocument {
  description?: string;
  image?: string;
  dockerfile?: string;
  user?: string;
  capabilities?: Capability[];
  env?: Record<string, string>;
  workdir?: string;
  setup?: StepDocument[];
  timeout?: string | number;
  resources?: Record<string, string | number>;
  network?: 'none' | 'host' | 'internet' | { allow_out?: string[]; deny_out?: string[] };
  runtime?: { node: number };
  start?: { cmd: string; ready?: string };
  allow_root?: boolean;
  workspace?: { from: string; path?: string };
}

/** Options of a step: who runs it (an image template's steps run as `root` by default). */
export interface StepOptions {
  user?: string;
}

/** Resource limits in `template.yaml`'s units: sizes as `512M`/`2G` or bytes, CPU in cores. */
export interface ResourceOptions {
  processes?: number;
  openFiles?: number;
  fileSize?: string | number;
  memory?: string | number;
  cpu?: number;
  disk?: string | number;
}

const words = (packages: string | readonly string[]): string => {
  const list = typeof packages === 'string' ? [packages] : [...packages];
  if (list.length === 0) throw new TypeError('name at least one package');
  return list.map(shellQuote).join(' ');
};

/**
 * A template in code: the same model as `template.yaml`, built by chaining. Each call returns a
 * new `Template` (a shared base can be extended two ways). `Templates.build(template, { name })`
 * builds it; `toYaml(name)` shows the `template.yaml` it equals.
 *
 * @example
 * const tpl = Template.fromImage('python:3.12-slim')
 *   .aptInstall(['jq'])
 *   .pipInstall(['pandas'])
 *   .copy('./data', '/home/user/data')
 *   .setEnvs({ MODE: 'batch' })
 *   .setWorkdir('/home/user');
 * await Templates.build(tpl, { name: 'data-tools' });
 */
export class Template {
  private constructor(private readonly doc: Readonly<TemplateDocument>) {}

  /** Starts from a container image (`python:3.12-slim`, `debian:12-slim`, `alpine:3.20`...). */
  static fromImage(image: string): Template {
    return new Template({ image });
  }

  /** Starts from the image a Dockerfile builds; a relative path is relative to the working directory. */
  static fromDockerfile(path: string): Template {
    return new Template({ dockerfile: resolve(path) });
  }

  /** Starts from the host's own system (no image): `setup` can only write the home folder. */
  static fromBase(): Template {
    return new Template({});
  }

  private with(change: Partial<TemplateDocument>): Template {
    return new Template({ ...this.doc, ...change });
  }

  private step(step: StepDocument): Template {
    return this.with({ setup: [...(this.doc.setup ?? []), step] });
  }

  /** Runs a shell command at build time (several: one step each). */
  runCmd(command: string | readonly string[], options: StepOptions = {}): Template {
    const commands = typeof command === 'string' ? [command] : command;
    let next: Template = this;
    for (const run of commands) {
      next = next.step(options.user === undefined ? { run } : { run, user: options.user });
    }
    return next;
  }

  /** Installs Debian/Ubuntu packages with apt (as root), cleaning apt's lists afterwards. */
  aptInstall(packages: string | readonly string[]): Template {
    return this.runCmd(
      `apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${words(packages)} && rm -rf /var/lib/apt/lists/*`,
      { user: 'root' },
    );
  }

  /** Installs Python packages with pip (as root unless `user` says otherwise). */
  pipInstall(packages: string | readonly string[], options: StepOptions = {}): Template {
    // PIP_BREAK_SYSTEM_PACKAGES: Debian's own python refuses pip without it (PEP 668).
    return this.runCmd(
      `PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir ${words(packages)}`,
      options,
    );
  }

  /** Installs npm packages, globally by default. */
  npmInstall(
    packages: string | readonly string[],
    options: StepOptions & { global?: boolean } = {},
  ): Template {
    const { global = true, ...step } = options;
    return this.runCmd(`npm install ${global ? '-g ' : ''}${words(packages)}`, step);
  }

  /** Copies a host file or folder into the image; a relative `from` is relative to the working directory. */
  copy(from: string, to: string, options: StepOptions = {}): Template {
    const step = { copy: resolve(from), to };
    return this.step(options.user === undefined ? step : { ...step, user: options.user });
  }

  /** Environment variables of every process in the sandbox (merged over earlier ones). */
  setEnvs(env: Record<string, string>): Template {
    return this.with({ env: { ...this.doc.env, ...env } });
  }

  /** The working directory of commands. */
  setWorkdir(path: string): Template {
    return this.with({ workdir: path });
  }

  /** The user the sandbox runs as (created when the image lacks it); default `user`. */
  setUser(user: string): Template {
    return this.with({ user });
  }

  /**
   * A command each sandbox starts in the background when it is created (a server, say), and a
   * command the create runs until it exits 0 before it answers (`ready`, 2 minutes at most).
   */
  setStartCmd(cmd: string, ready?: string): Template {
    return this.with({ start: ready === undefined ? { cmd } : { cmd, ready } });
  }

  /**
   * Root inside the sandboxes (image templates only): `user: 'root'` for commands and files, and
   * `sudo` for the default user. Root is uid 0 of the sandbox's own user namespace, an
   * unprivileged uid on the host, without mounts, network administration or raw sockets
   * (docs/security.md). Only where the provider can give it: the local provider on a root daemon.
   */
  allowRoot(allow = true): Template {
    return this.with({ allow_root: allow });
  }

  /**
   * A host folder each sandbox mounts copy-on-write at `path` (default
   * `/home/user/workspace`), as `Sandbox.create({ workspace })` does, checked for the key that
   * creates (docs/workspaces.md); a relative `from` is relative to the working directory.
   */
  setWorkspace(from: string, path?: string): Template {
    return this.with({
      workspace: { from: resolve(from), ...(path === undefined ? {} : { path }) },
    });
  }

  setDescription(description: string): Template {
    return this.with({ description });
  }

  /** What the sandboxes may do: `shell`, `files`, `code`, `ports`. */
  setCapabilities(capabilities: readonly Capability[]): Template {
    return this.with({ capabilities: [...capabilities] });
  }

  /** Default lifetime of a sandbox: `30s`, `10m`, `1h`, or milliseconds. */
  setTimeout(timeout: string | number): Template {
    return this.with({ timeout: typeof timeout === 'number' ? `${timeout}ms` : timeout });
  }

  setResources(resources: ResourceOptions): Template {
    const { openFiles, fileSize, ...rest } = resources;
    return this.with({
      resources: {
        ...(rest as Record<string, string | number>),
        ...(openFiles === undefined ? {} : { open_files: openFiles }),
        ...(fileSize === undefined ? {} : { file_size: fileSize }),
      },
    });
  }

  /**
   * `none` (default): only the sandbox's loopback; `internet`: egress through abx's policy, here
   * `{ allowOut, denyOut, rules }` (CIDRs, domain names, `*.` wildcards; an allow entry wins;
   * per-host header rules with `${secrets.NAME}` placeholders, docs/network.md);
   * `host`: the host's own network namespace.
   */
  setNetwork(
    network: 'none' | 'host' | 'internet',
    policy?: {
      allowOut?: string[];
      denyOut?: string[];
      rules?: Record<string, Array<{ transform?: { headers?: Record<string, string> } }>>;
    },
  ): Template {
    if (policy && network !== 'internet') {
      throw new TypeError(
        `setNetwork: a policy applies to the internet network only, not ${network}`,
      );
    }
    return this.with({
      network: policy
        ? {
            allow_out: policy.allowOut ?? [],
            deny_out: policy.denyOut ?? [],
            ...(policy.rules ? { rules: policy.rules } : {}),
          }
        : network,
    });
  }

  /**
   * The Node line (major version) the sandboxes' envd and command server must run on, such as
   * 24: a build or a create fails, saying which Node is there and how to get this one, when it
   * is another (`runtime: { node }` in `template.yaml`).
   */
  requireNode(line: number): Template {
    return this.with({ runtime: { node: line } });
  }

  /** The `template.yaml` this template equals, named `name`. */
  toYaml(name: string): string {
    return stringify({ name, ...this.doc }, { lineWidth: 0 });
  }
}
