import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { BuildProgress } from '../../runtime/protocol/wire.js';
import { TEMPLATE_NAME_PATTERN } from '../commands/custom-command.js';
import { DEFAULT_CAPABILITIES, parseTemplate, type TemplateSpec } from '../commands/template.js';
import {
  DEFAULT_SANDBOX_TIMEOUT_MS,
  DEFAULT_USER,
  DEFAULT_WORKDIR,
  type SetupStep,
} from '../commands/template-runtime.js';
import {
  InvalidArgumentError,
  PermissionDeniedError,
  SandboxError,
  TemplateBuildError,
  TemplateConflictError,
  TemplateNotFoundError,
} from '../errors.js';
import { repositoryComponent } from '../providers/docker/image-reference.js';
import {
  type ImageStore,
  rootUnavailableOn,
  SANDBOX_HOME,
  type SandboxHandle,
  type SandboxProvider,
  type SandboxSpec,
} from '../providers/provider.js';
import { extractTar } from '../util/safe-extract.js';
import { copyIntoSandbox, envdStream } from './envd-request.js';
import { eventFor } from './events.js';
import { newSandboxId, newToken } from './ids.js';
import { checkNodeLine } from './node-line.js';
import type { Registry, TemplateRecord } from './registry.js';
import { type SnapshotWorkspace, snapshotLayerDir } from './snapshot-workspace.js';
import {
  DAEMON,
  type TemplateAction,
  type TemplatePrincipal,
  templateAccess,
  templateBuildNetwork,
  templateBuildRefusals,
} from './template-access.js';

/** The template every installation has, without a build. */
export const BASE_TEMPLATE: TemplateSpec = {
  name: 'base',
  description: 'A plain sandbox: shell, files and code, and the internet through egress policy',
  capabilities: [...DEFAULT_CAPABILITIES],
  customCommands: [],
  places: {},
  env: {},
  workdir: DEFAULT_WORKDIR,
  user: DEFAULT_USER,
  setup: [],
  timeoutMs: DEFAULT_SANDBOX_TIMEOUT_MS,
  resources: {},
  network: 'internet',
  networkDefault: true,
};

/** A spec stored by an older version: setup steps were plain strings, there was no `user`. */
function upgradeSpec(spec: TemplateSpec): TemplateSpec {
  const steps = spec.setup as (SetupStep | string)[];
  return {
    ...spec,
    user: spec.user ?? DEFAULT_USER,
    setup: steps.map((step) =>
      typeof step === 'string' ? { run: step, user: DEFAULT_USER } : step,
    ),
  };
}

/** The network a build sandbox is started on. */
type BuildNetwork = Pick<SandboxSpec, 'network' | 'egress'>;

/** The progress event of a setup step. */
function stepProgress(spec: TemplateSpec, index: number, step: SetupStep): BuildProgress {
  const what = 'copy' in step ? `copy ${step.copy} → ${step.to}` : step.run;
  const as = step.user === spec.user && !spec.image && !spec.dockerfile ? '' : ` (as ${step.user})`;
  return { phase: 'step', step: index, of: spec.setup.length, text: `${what}${as}` };
}

/** A template ready to start sandboxes from. */
/** A snapshot's description: it names the sandbox and template it was saved from. */
function snapshotDescription(sandboxId: string, template: string): string {
  return `snapshot of sandbox ${sandboxId} (template ${template})`;
}

/** The sandbox a template was saved from by {@link TemplateService.snapshot}; undefined for others. */
export function snapshotSource(template: { description?: string | undefined }): string | undefined {
  return /^snapshot of sandbox ([a-z0-9-]{1,64}) \(template [^)]*\)$/.exec(
    template.description ?? '',
  )?.[1];
}

export interface BuiltTemplate {
  spec: TemplateSpec;
  /** The home folder its setup produced; sandboxes start from a copy. */
  homeDir?: string;
  /** The image its sandboxes start from (an image template), as the provider's image store named it. */
  image?: string;
  /** A snapshot's kept workspace layer (spec.snapshotWorkspace), copied into each sandbox. */
  workspaceLayer?: string;
  builtAt: number;
  /** The key that built it or took it (null: the daemon's own key, or made before owners). */
  owner: string | null;
  /** In the shared catalogue (every key uses it); otherwise its owner's and admins' only. */
  shared: boolean;
}

/** Runs one shell step in a sandbox (as `user` when given): the exit code and the combined output. */
export type StepRunner = (
  handle: SandboxHandle,
  accessToken: string,
  command: string,
  user?: string,
  /** The output as it arrives, for the build's log. */
  onOutput?: (text: string, stream: 'stdout' | 'stderr') => void,
) => Promise<{ exitCode: number; output: string }>;

/** The longest line of a step's output a build's log shows whole. */
const OUTPUT_LINE_MAX = 4000;

/**
 * Cuts a step's output into `output` progress events, one per line: `write` takes chunks as they
 * come, `end` gives the last line that had no newline.
 */
function outputLines(
  spec: TemplateSpec,
  step: number,
  onProgress: (event: BuildProgress) => void,
): { write(text: string, stream: 'stdout' | 'stderr'): void; end(): void } {
  // Each stream's unfinished line, so stdout's and stderr's never join.
  const pending = { stdout: '', stderr: '' };
  const emit = (line: string) =>
    onProgress({
      phase: 'output',
      step,
      of: spec.setup.length,
      text: line.length > OUTPUT_LINE_MAX ? `${line.slice(0, OUTPUT_LINE_MAX)}…` : line,
    });
  return {
    write(text, stream) {
      const lines = (pending[stream] + text).split('\n');
      pending[stream] = lines.pop() ?? '';
      // A line that never ends still shows, in pieces.
      if (pending[stream].length > OUTPUT_LINE_MAX) {
        lines.push(pending[stream]);
        pending[stream] = '';
      }
      for (const line of lines) emit(line.replace(/\r$/, ''));
    },
    end() {
      for (const stream of ['stdout', 'stderr'] as const) {
        if (pending[stream] !== '') emit(pending[stream]);
        pending[stream] = '';
      }
    },
  };
}

/** A stored build as the services use it. */
function built(record: TemplateRecord): BuiltTemplate {
  return {
    spec: upgradeSpec(record.spec as TemplateSpec),
    ...(record.dir ? { homeDir: join(record.dir, 'home') } : {}),
    ...(record.image ? { image: record.image } : {}),
    ...(record.dir && (record.spec as TemplateSpec).snapshotWorkspace
      ? { workspaceLayer: snapshotLayerDir(record.dir) }
      : {}),
    builtAt: record.builtAt,
    owner: record.owner,
    shared: record.shared,
  };
}

/** The built-in template: shared, no owner. */
const BASE_BUILT: BuiltTemplate = { spec: BASE_TEMPLATE, builtAt: 0, owner: null, shared: true };

/** What a refused key is told of an admin-only change to a template it may see. */
function adminRequired(name: string, action: TemplateAction, who: TemplatePrincipal): Error {
  const what =
    action === 'publish'
      ? `publishing template '${name}' (or taking it out of the shared catalogue)`
      : `${action === 'remove' ? 'removing' : 'replacing'} template '${name}', which is in the shared catalogue,`;
  return new PermissionDeniedError(
    `${what} needs an admin API key, and the key '${who.name ?? who.keyId}' (${who.keyId}) is not one: ${action === 'publish' ? 'ask an admin of the control plane' : 'build your own template under another name, or ask an admin of the control plane'}`,
    { code: 'admin_required' },
  );
}

/**
 * Templates: `base`, plus those built from a `template.yaml`. Building runs the `setup` steps
 * once in a throwaway sandbox and keeps its home folder; each new sandbox starts from a copy of
 * it without running them again.
 */
export class TemplateService {
  constructor(
    private readonly registry: Registry,
    private readonly provider: SandboxProvider,
    private readonly templatesDir: string,
    private readonly runStep: StepRunner,
    /** Where image builds run when `provider` has no image store of its own (local → docker). */
    private readonly imageBuilder?: () => Promise<SandboxProvider>,
    /**
     * `registry[:port][/path]`: each built image template is pushed there, as
     * `abx-template-<name>:<content hash>`, and its sandboxes start from that reference (what a
     * cluster pulls). Unset: the image stays on the builder's engine.
     */
    private readonly imageRegistry?: string,
  ) {
    this.filesDir = join(templatesDir, '.e2b-files');
  }

  /** Where E2B's template builds keep their uploaded files (src/compat/e2b/template-files.ts). */
  readonly filesDir: string;

  /**
   * At the daemon's start, before any build: removes the build sandboxes a stopped daemon left
   * (builds it did not finish; their sandboxes live in the templates folder, which the sandboxes'
   * own sweep does not look at) and their work folders. Only where this provider builds images
   * itself (Docker): other providers' build sandboxes are not looked for. The ids removed.
   */
  async sweepBuilds(): Promise<string[]> {
    if (!this.provider.images) return [];
    const swept = await this.provider.sweepOrphans(this.templatesDir, new Set());
    let entries: string[] = [];
    try {
      entries = readdirSync(this.templatesDir);
    } catch {
      // no templates folder yet
    }
    for (const entry of entries) {
      if (entry.startsWith('.build-')) {
        rmSync(join(this.templatesDir, entry), { recursive: true, force: true });
      }
    }
    return swept;
  }

  /**
   * The network of a build sandbox on `provider` (template-access.ts decides which): the host's,
   * or the template's own as its sandboxes get it (an internet template offline where the
   * provider has no internet network and the template asked for none in particular).
   */
  private buildNetwork(
    provider: SandboxProvider,
    spec: TemplateSpec,
    who: TemplatePrincipal,
  ): BuildNetwork {
    // Setup steps usually download things; a template's sandboxes keep their own setting.
    if (templateBuildNetwork(who) === 'host') return { network: 'host' };
    if (spec.network === 'internet' && spec.networkDefault) {
      const unavailable = provider.internetUnavailable
        ? provider.internetUnavailable()
        : `the ${provider.name} provider has no internet network`;
      if (unavailable !== undefined) return { network: 'none' };
    }
    return { network: spec.network, ...(spec.egress ? { egress: spec.egress } : {}) };
  }

  /** The repository a template's image is pushed to: its name as a registry accepts it. */
  private repositoryOf(name: string): string {
    return `${this.imageRegistry}/abx-template-${repositoryComponent(name)}`;
  }

  /**
   * Pushes a built image to the image registry; the local build tag goes either way (the pushed
   * reference stays a local name of the image; after a failure nothing of the build is left).
   */
  private async pushImage(
    images: ImageStore,
    spec: TemplateSpec,
    image: string,
    onProgress: (event: BuildProgress) => void,
  ): Promise<string> {
    const repository = this.repositoryOf(spec.name);
    try {
      if (!images.publish) {
        throw new InvalidArgumentError(
          `template '${spec.name}': the image builder cannot push images to ${this.imageRegistry}`,
        );
      }
      onProgress({ phase: 'push', text: `pushing the image to ${repository}` });
      // Its errors name the registry and what to do (unreachable: 503, refused: 403).
      return await images.publish(image, repository);
    } finally {
      await images.remove(image).catch(() => undefined);
    }
  }

  /** The provider that builds image templates: this one, or the builder (made on demand). */
  private async builderFor(spec: TemplateSpec): Promise<SandboxProvider & { images: ImageStore }> {
    if (this.provider.images) return this.provider as SandboxProvider & { images: ImageStore };
    const builder = await this.imageBuilder?.();
    if (builder?.images) return builder as SandboxProvider & { images: ImageStore };
    throw new InvalidArgumentError(
      `template '${spec.name}' starts from an image, which the ${this.provider.name} provider cannot build; start the daemon with the docker provider (abx daemon start --provider docker)`,
    );
  }

  /** True when another template than `except` starts from `image` (a snapshot shares its source's). */
  private async imageInUse(image: string, except: string): Promise<boolean> {
    return (await this.registry.listTemplates()).some(
      (t) => t.name !== except && t.image === image,
    );
  }

  /** Removes a template image no template uses any more (an engine that is gone is no error). */
  private async dropImage(image: string | null | undefined, owner: string): Promise<void> {
    if (!image || (await this.imageInUse(image, owner))) return;
    await (await this.imageStore())?.remove(image).catch(() => undefined);
    await this.provider.pruneImages?.();
  }

  /** The image store that holds template images, if any can be reached (for removals). */
  private async imageStore(): Promise<ImageStore | undefined> {
    if (this.provider.images) return this.provider.images;
    return (await this.imageBuilder?.().catch(() => undefined))?.images;
  }

  /**
   * The template `name` as `who` may use it (default: the daemon's own work, which sees every
   * template). Another key's private template answers exactly as a name that is not built.
   */
  async get(name: string, who: TemplatePrincipal = DAEMON): Promise<BuiltTemplate> {
    if (name === BASE_TEMPLATE.name) return BASE_BUILT;
    return built(await this.record(name, who, 'use'));
  }

  /**
   * The record of `name` if `who` may do `action` with it; TemplateNotFoundError when there is
   * none or `who` may not know it (the same answer), PermissionDeniedError when it may see it but
   * not change it.
   */
  private async record(
    name: string,
    who: TemplatePrincipal,
    action: TemplateAction,
  ): Promise<TemplateRecord> {
    const record = await this.registry.getTemplate(name);
    const decision = record ? templateAccess(who, record, action) : 'hidden';
    if (!record || decision === 'hidden') {
      if (action !== 'use') throw new TemplateNotFoundError(`template '${name}' does not exist`);
      const known = (await this.list(who)).map((t) => t.spec.name);
      throw new TemplateNotFoundError(
        `template '${name}' is not built; known templates: ${known.join(', ')}. Build it with \`abx template build path/to/template.yaml\``,
      );
    }
    if (decision === 'admin_required') throw adminRequired(name, action, who);
    return record;
  }

  /** The templates `who` may use: `base`, the shared catalogue, and its own. */
  async list(who: TemplatePrincipal = DAEMON): Promise<BuiltTemplate[]> {
    const records = await this.registry.listTemplates();
    return [
      BASE_BUILT,
      ...records.filter((r) => templateAccess(who, r, 'use') === 'allowed').map(built),
    ];
  }

  /**
   * Refuses to write `name` for `who` over a template it may not replace (called before a build
   * starts, and again in the registry's transaction that writes it): another key's private one
   * is a TemplateConflictError that says nothing more than that the name is taken.
   */
  private replaceCheck(name: string, who: TemplatePrincipal) {
    return (previous: TemplateRecord | undefined): void => {
      if (!previous) return;
      const decision = templateAccess(who, previous, 'replace');
      if (decision === 'hidden') {
        throw new TemplateConflictError(
          `the template name '${name}' is taken by a template this key cannot see: choose another name`,
          { code: 'template_name_taken' },
        );
      }
      if (decision === 'admin_required') throw adminRequired(name, 'replace', who);
    };
  }

  /**
   * Puts a template into the shared catalogue (`shared` true: every key lists it and creates
   * from it) or takes it out (back to its owner and admins). Admin keys only.
   */
  async publish(
    name: string,
    shared: boolean,
    who: TemplatePrincipal = DAEMON,
  ): Promise<BuiltTemplate> {
    if (name === BASE_TEMPLATE.name) {
      throw new InvalidArgumentError("'base' is built in and always shared");
    }
    await this.record(name, who, 'publish');
    const record = await this.registry.setTemplateShared(name, shared);
    if (!record) throw new TemplateNotFoundError(`template '${name}' does not exist`);
    return built(record);
  }

  /**
   * Builds (or rebuilds) a template: the YAML file at a path, or `yaml` text (a template made in
   * code, whose paths are absolute already). The previous build stays until this one is done.
   */
  async build(
    source: string | { yaml: string; path?: string },
    onProgress: (event: BuildProgress) => void = () => {},
    /** Who builds: a new template is an admin's shared one, another key's own (private). */
    who: TemplatePrincipal = DAEMON,
    /** A folder of files `who` uploaded for this build, which its copy steps may copy from. */
    uploaded?: string,
    /**
     * The image of a template `who` may use, which this one starts from (E2B's `fromTemplate`):
     * allowed as `image:` to a key that is no admin (templateBuildRefusals).
     */
    baseImage?: string,
  ): Promise<BuiltTemplate> {
    let spec: TemplateSpec;
    if (typeof source !== 'string') {
      // A bad template is a TemplateError (an InvalidArgumentError) naming line and column.
      spec = parseTemplate(source.yaml, source.path ?? 'template (from code)');
    } else {
      const file = resolve(source);
      let text: string;
      try {
        text = readFileSync(file, 'utf8');
      } catch (error) {
        throw new InvalidArgumentError(`cannot read template ${file}: ${(error as Error).message}`);
      }
      spec = { ...parseTemplate(text, file), path: file };
    }
    if (spec.name === BASE_TEMPLATE.name) {
      throw new InvalidArgumentError("'base' is built in; give your template another name");
    }
    const refusals = templateBuildRefusals(who, spec, uploaded, baseImage);
    if (refusals.length > 0) {
      throw new PermissionDeniedError(
        `template '${spec.name}' has ${refusals.join(', ')}: building that needs an admin API key, and the key '${who.name ?? who.keyId}' (${who.keyId}) is not one; leave it out, or ask an admin of the control plane`,
        { code: 'admin_required' },
      );
    }
    const check = this.replaceCheck(spec.name, who);
    // Before anything is made: a name this key may not write is refused at once.
    check(await this.registry.getTemplate(spec.name));
    const network = (provider: SandboxProvider) => this.buildNetwork(provider, spec, who);
    const owned = { owner: who.keyId, shared: who.admin };
    const fromImage = spec.image !== undefined || spec.dockerfile !== undefined;
    // Before anything is made: a template whose sandboxes would run another Node is not built.
    await checkNodeLine(spec.name, spec.runtime?.node, this.provider, fromImage);
    const noRoot = spec.allowRoot ? rootUnavailableOn(this.provider) : undefined;
    if (noRoot !== undefined) {
      throw new InvalidArgumentError(
        `template '${spec.name}' allows root, which this daemon cannot give: ${noRoot}; leave allow_root out, or run the daemon as root on the local provider`,
      );
    }
    if (fromImage) return this.buildImage(spec, onProgress, owned, check, network);
    const dir = join(this.templatesDir, spec.name);
    const staged =
      spec.setup.length > 0
        ? await this.runSetup(spec, dir, onProgress, network(this.provider))
        : undefined;
    const homeDir = staged ? join(dir, 'home') : undefined;
    const builtAt = Date.now();
    let previous: TemplateRecord | undefined;
    try {
      previous = await this.registry.upsertTemplate(
        { name: spec.name, spec, dir: homeDir ? dir : null, image: null, builtAt, ...owned },
        (found) => {
          check(found);
          // Once, in the write's transaction: the folder changes only for a write that happens.
          rmSync(dir, { recursive: true, force: true });
          if (staged) renameSync(staged, dir);
        },
      );
    } finally {
      if (staged) rmSync(staged, { recursive: true, force: true });
    }
    if (previous?.image)
      await (await this.imageStore())?.remove(previous.image).catch(() => undefined);
    return {
      spec,
      ...(homeDir ? { homeDir } : {}),
      builtAt,
      ...(previous ? { owner: previous.owner, shared: previous.shared } : owned),
    };
  }

  /**
   * An image template: the provider prepares the image (with the template's user), a build
   * sandbox runs the setup steps in it as root (or as each step's user), and its filesystem is
   * committed as the template's image. A failure leaves the previous build as it was.
   */
  private async buildImage(
    spec: TemplateSpec,
    onProgress: (event: BuildProgress) => void,
    owned: { owner: string | null; shared: boolean },
    check: (previous: TemplateRecord | undefined) => void,
    network: (provider: SandboxProvider) => BuildNetwork,
  ): Promise<BuiltTemplate> {
    const builder = await this.builderFor(spec);
    const images = builder.images;
    const builtAt = Date.now();
    // An engine takes lower-case repositories only; the tag keeps builds of `A` and `a` apart.
    const tag = `abx-template/${repositoryComponent(spec.name)}:${builtAt}`;
    const source =
      spec.image !== undefined ? { image: spec.image } : { dockerfile: spec.dockerfile as string };
    onProgress({
      phase: 'prepare',
      text: `preparing ${'image' in source ? `image ${source.image}` : source.dockerfile} with user ${spec.user}`,
    });
    const prepared = await images.prepare(source, {
      user: spec.user,
      tag: spec.setup.length > 0 ? `${tag}-base` : tag,
    });
    let image = prepared;
    if (spec.setup.length > 0) {
      try {
        image = await this.runImageSetup(
          builder,
          spec,
          prepared,
          tag,
          onProgress,
          network(builder),
        );
      } finally {
        await images.remove(prepared).catch(() => undefined);
      }
    }
    if (this.imageRegistry) image = await this.pushImage(images, spec, image, onProgress);
    let previous: TemplateRecord | undefined;
    try {
      previous = await this.registry.upsertTemplate(
        { name: spec.name, spec, dir: null, image, builtAt, ...owned },
        check,
      );
    } catch (error) {
      // Refused at the write (the name was taken meanwhile): nothing of this build is kept.
      await this.dropImage(image, spec.name);
      throw error;
    }
    rmSync(join(this.templatesDir, spec.name), { recursive: true, force: true });
    // An engine refuses to remove an image containers still run from: it stays (see images.md).
    if (previous?.image !== image) await this.dropImage(previous?.image, spec.name);
    return {
      spec,
      image,
      builtAt,
      ...(previous ? { owner: previous.owner, shared: previous.shared } : owned),
    };
  }

  /** Runs the setup steps in a build sandbox of `image` and commits the result as `tag`. */
  private async runImageSetup(
    builder: SandboxProvider & { images: ImageStore },
    spec: TemplateSpec,
    image: string,
    tag: string,
    onProgress: (event: BuildProgress) => void,
    network: BuildNetwork,
  ): Promise<string> {
    const work = join(this.templatesDir, `.build-${spec.name}-${newSandboxId()}`);
    mkdirSync(work, { recursive: true });
    const accessToken = newToken();
    let handle: SandboxHandle;
    try {
      handle = await builder.create({
        id: `build-${spec.name.slice(0, 40)}-${newSandboxId().slice(-8)}`,
        accessToken,
        dir: work,
        env: spec.env,
        workdir: '/',
        resources: spec.resources,
        ...network,
        image,
        user: 'root',
      });
    } catch (error) {
      rmSync(work, { recursive: true, force: true });
      throw error;
    }
    try {
      // Copies go through the engine when it can take them: the image may have no `tar`.
      const copyIn = builder.images.copyIn?.bind(builder.images);
      await this.runSteps(spec, handle, accessToken, onProgress, copyIn);
      onProgress({ phase: 'commit', text: `saving the image ${tag}` });
      return await builder.images.commit(handle, tag);
    } finally {
      await builder.kill(handle);
      rmSync(work, { recursive: true, force: true });
    }
  }

  async remove(name: string, who: TemplatePrincipal = DAEMON): Promise<void> {
    if (name === BASE_TEMPLATE.name)
      throw new InvalidArgumentError("'base' is built in and cannot be removed");
    // Who owns a template changes only by an admin's publish, so the check holds until the delete.
    await this.record(name, who, 'remove');
    const record = await this.registry.removeTemplate(name);
    if (!record) {
      throw new TemplateNotFoundError(`template '${name}' does not exist`);
    }
    rmSync(join(this.templatesDir, name), { recursive: true, force: true });
    await this.dropImage(record.image, name);
  }

  /**
   * Copies the home of a live build sandbox to `dest` through envd's archive (the same for every
   * provider). What the sandbox wrote is hostile: the checking extractor keeps permission bits
   * only, refuses devices, hard links and escaping names, and never writes through a link.
   */
  private async exportHome(handle: SandboxHandle, token: string, dest: string): Promise<void> {
    const response = await envdStream(
      handle.envdSocket,
      token,
      // The home's own file system: a workspace or volume mounted in it is not the home's.
      `/files/archive?path=${encodeURIComponent(SANDBOX_HOME)}&one_file_system=true`,
    );
    if (response.statusCode !== 200) {
      const text = await new Promise<string>((resolve) => {
        let body = '';
        response.on('data', (chunk: Buffer) => {
          body += chunk;
        });
        response.on('end', () => resolve(body));
        response.on('error', () => resolve(body));
      });
      throw new SandboxError(
        `could not copy the built home out of the build sandbox (${response.statusCode}): ${text.slice(0, 500)}`,
      );
    }
    mkdirSync(dest, { recursive: true, mode: 0o755 });
    await extractTar(response, dest);
  }

  /** Runs every setup step in the build sandbox, in order, saying which starts. */
  private async runSteps(
    spec: TemplateSpec,
    handle: SandboxHandle,
    token: string,
    onProgress: (event: BuildProgress) => void,
    copyIn?: ImageStore['copyIn'],
  ): Promise<void> {
    for (const [index, step] of spec.setup.entries()) {
      onProgress(stepProgress(spec, index, step));
      const lines = outputLines(spec, index, onProgress);
      try {
        await this.buildStep(spec, index, step, handle, token, copyIn, lines.write);
      } finally {
        lines.end();
      }
    }
  }

  /** Runs one setup step in the build sandbox; a failure is a TemplateBuildError naming it. */
  private async buildStep(
    spec: TemplateSpec,
    index: number,
    step: SetupStep,
    handle: SandboxHandle,
    token: string,
    copyIn?: ImageStore['copyIn'],
    onOutput?: (text: string, stream: 'stdout' | 'stderr') => void,
  ): Promise<void> {
    const where = `template '${spec.name}': setup[${index}]`;
    if ('copy' in step) {
      try {
        if (copyIn) await copyIn(handle, step.copy, step.to, step.user);
        else await copyIntoSandbox(handle, token, step.copy, step.to, step.user);
      } catch (error) {
        throw new TemplateBuildError(
          `${where} copy ${step.copy} to ${step.to} failed: ${(error as Error).message}`,
          { details: { step: index, command: `copy ${step.copy} ${step.to}` }, cause: error },
        );
      }
      return;
    }
    const { exitCode, output } = await this.runStep(handle, token, step.run, step.user, onOutput);
    if (exitCode !== 0) {
      const tail = output.slice(-2000);
      throw new TemplateBuildError(
        `${where} \`${step.run}\` exited with code ${exitCode}${tail ? `; its output ends:\n${tail}` : ' and printed nothing'}`,
        { details: { step: index, command: step.run, exitCode, output: tail } },
      );
    }
  }

  private async runSetup(
    spec: TemplateSpec,
    dir: string,
    onProgress: (event: BuildProgress) => void,
    network: BuildNetwork,
  ): Promise<string> {
    const work = `${dir}.build-${newSandboxId()}`;
    mkdirSync(work, { recursive: true });
    const accessToken = newToken();
    const handle = await this.provider
      .create({
        // Unique on the host: two installations may build templates of the same name at once.
        id: `build-${spec.name.slice(0, 40)}-${newSandboxId().slice(-8)}`,
        accessToken,
        dir: work,
        env: spec.env,
        workdir: spec.workdir,
        resources: spec.resources,
        ...network,
      })
      .catch((error) => {
        rmSync(work, { recursive: true, force: true });
        throw error;
      });
    try {
      await this.runSteps(spec, handle, accessToken, onProgress);
    } catch (error) {
      await this.provider.kill(handle);
      rmSync(work, { recursive: true, force: true });
      throw error;
    }
    // Staged beside the template's folder; the build puts it in place once its write is allowed.
    const staged = `${dir}.staged-${newSandboxId()}`;
    try {
      await this.exportHome(handle, accessToken, join(staged, 'home'));
    } catch (error) {
      rmSync(staged, { recursive: true, force: true });
      throw error;
    } finally {
      await this.provider.kill(handle);
      rmSync(work, { recursive: true, force: true });
    }
    return staged;
  }

  /**
   * Turns a running sandbox into the template `name`: its home folder (exported through envd, as
   * a build's), and on a provider that runs images its whole filesystem too (committed as an
   * image). Sandboxes of `name` start from that state with the source template's settings. An
   * existing template of that name is replaced once the snapshot is complete. A sandbox with a
   * workspace: `saveWorkspace` copies its changes into the snapshot's folder (snapshot-workspace.ts).
   */
  async snapshot(
    sandbox: { id: string; template: string; handle: SandboxHandle; owner?: string | null },
    token: string,
    name: string,
    /** Who takes it: the snapshot is that key's own (private), an admin's too. */
    who: TemplatePrincipal = DAEMON,
    saveWorkspace?: (to: string) => Promise<SnapshotWorkspace>,
  ): Promise<BuiltTemplate> {
    if (!TEMPLATE_NAME_PATTERN.test(name) || name.length > 64) {
      throw new InvalidArgumentError(
        `snapshot name ${JSON.stringify(name)} must be letters, digits, ".", "_" and "-" (64 at most), such as my-snapshot`,
      );
    }
    if (name === BASE_TEMPLATE.name) {
      throw new InvalidArgumentError("'base' is built in; give the snapshot another name");
    }
    const check = this.replaceCheck(name, who);
    check(await this.registry.getTemplate(name));
    const source = await this.get(sandbox.template);
    const builtAt = Date.now();
    const dir = join(this.templatesDir, name);
    const staged = join(this.templatesDir, `.snapshot-${name}-${newSandboxId()}`);
    let image: string | undefined;
    let workspace: SnapshotWorkspace | undefined;
    try {
      await this.exportHome(sandbox.handle, token, join(staged, 'home'));
      if (sandbox.handle.workspace) {
        if (!saveWorkspace) {
          throw new InvalidArgumentError(
            `sandbox ${sandbox.id} has a workspace, which this snapshot cannot keep`,
          );
        }
        workspace = await saveWorkspace(snapshotLayerDir(staged));
      }
      if (this.provider.images) {
        image = await this.provider.images.commit(
          sandbox.handle,
          `abx-template/${repositoryComponent(name)}:${builtAt}`,
        );
      } else {
        // A provider that cannot commit keeps the image the sandbox runs on; the home is saved.
        image = source.image;
      }
    } catch (error) {
      rmSync(staged, { recursive: true, force: true });
      throw error;
    }
    const spec: TemplateSpec = {
      ...source.spec,
      name,
      description: snapshotDescription(sandbox.id, sandbox.template),
      // What the steps made is in the snapshot already.
      setup: [],
    };
    delete spec.path;
    // A sandbox with a workspace: its snapshot mounts that one again (a template.yaml's went into it).
    if (workspace) {
      spec.snapshotWorkspace = workspace;
      delete spec.workspace;
    } else delete spec.snapshotWorkspace;
    // A snapshot holds the sandbox's files: it is never shared by itself (publish shares it).
    const owned = { owner: who.keyId, shared: false };
    // The sandbox's `checkpointed` event (E2B's name for a snapshot taken), written in the
    // template's transaction: no snapshot without its event, no event without its snapshot.
    const event = eventFor(
      { id: sandbox.id, owner: sandbox.owner ?? null, template: sandbox.template },
      { type: 'sandbox.lifecycle.checkpointed', data: { snapshot: name } },
    );
    let previous: TemplateRecord | undefined;
    try {
      previous = await this.registry.upsertTemplate(
        { name, spec, dir, image: image ?? null, builtAt, ...owned },
        (found) => {
          check(found);
          // In the transaction: the folder is swapped only for a write that will happen.
          rmSync(dir, { recursive: true, force: true });
          renameSync(staged, dir);
        },
        event,
      );
    } catch (error) {
      rmSync(staged, { recursive: true, force: true });
      if (image && image !== source.image) await this.dropImage(image, name);
      throw error;
    }
    if (previous?.image !== image) await this.dropImage(previous?.image, name);
    return {
      spec,
      homeDir: join(dir, 'home'),
      ...(image ? { image } : {}),
      ...(workspace ? { workspaceLayer: snapshotLayerDir(dir) } : {}),
      builtAt,
      ...(previous ? { owner: previous.owner, shared: previous.shared } : owned),
    };
  }
}
