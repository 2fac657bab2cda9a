/**
 * E2B's template builds (its Template SDK: `Template.build`, `buildInBackground`,
 * `getBuildStatus`, `exists`, `getTags`) on abx's own template builder: the steps the SDK sends
 * become a `template.yaml` through abx's `Template` (src/commands/template-builder.ts) and
 * TemplateService builds it, with its owners and refusals. The template's id is its name. Files
 * of `copy()` steps are uploaded once per key by hash (template-files.ts). Builds run in the
 * background; their status and log lines are kept in memory and on disk (template-build-records.ts,
 * the last MAX_BUILDS builds), so a build's status outlives a daemon restart.
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { basename, join, posix } from 'node:path';
import type { BuildProgress } from '../../../runtime/protocol/wire.js';
import { TEMPLATE_NAME_PATTERN } from '../../commands/custom-command.js';
import { Template } from '../../commands/template-builder.js';
import { DEFAULT_WORKDIR } from '../../commands/template-runtime.js';
import {
  InvalidArgumentError,
  NotFoundError,
  SandboxError,
  TemplateConflictError,
} from '../../errors.js';
import { shellQuote } from '../../util/shell-quote.js';
import type { E2bBackend, E2bCaller, E2bTemplateBase } from './backend.js';
import {
  appendLog,
  BUILD_RECORD_FLUSH_MS,
  type BuildLogEntry,
  type BuildRecord,
  BuildRecords,
  INTERRUPTED,
  MAX_BUILDS,
} from './template-build-records.js';
import { checkFilesHash, sourceInside, TemplateFiles } from './template-files.js';

/** What a template build route gets. */
export interface TemplateBuildCall {
  params: Record<string, string>;
  query: URLSearchParams;
  body: Record<string, unknown>;
  caller: E2bCaller;
  backend: E2bBackend;
  /** The origin the caller reached the API at (`http://host:port`), for upload links. */
  origin: string;
}

export interface TemplateBuildAnswer {
  status: number;
  body: unknown;
}

/**
 * The upload a request is, if it is one: `PUT /templates/{id}/files/{hash}?upload=<token>`, the
 * link `GET /templates/{id}/files/{hash}` gave (it carries no API key: the token is the right).
 */
export function uploadTarget(
  method: string | undefined,
  url: string | undefined,
): { hash: string; token: string } | undefined {
  if (method !== 'PUT' || !url) return undefined;
  const parsed = new URL(url, 'http://upload');
  const match = /^\/templates\/[^/]+\/files\/([^/]+)$/.exec(parsed.pathname);
  const token = parsed.searchParams.get('upload');
  if (!match || !token) return undefined;
  return { hash: decodeURIComponent(match[1] as string), token };
}

type Build = BuildRecord;

/** A 404 in E2B's words: another key's build answers exactly as one that never was. */
function buildNotFound(id: string): NotFoundError {
  return new NotFoundError(
    `template build ${id} not found: it does not exist, is another key's, or was forgotten (the daemon keeps the last ${MAX_BUILDS} builds)`,
  );
}

/** A step abx cannot express: 400, naming it, before anything is built. */
function refused(index: number, type: string, why: string): InvalidArgumentError {
  return new InvalidArgumentError(
    `template step ${index + 1} (${type}) is not supported by abx: ${why}; nothing was built`,
  );
}

function stringArgs(step: Record<string, unknown>, index: number, type: string): string[] {
  const args = step.args ?? [];
  if (!Array.isArray(args) || args.some((a) => typeof a !== 'string')) {
    throw refused(index, type, 'its args must be a list of strings');
  }
  return args as string[];
}

/** One COPY step as the translation needs it: where the uploaded files go. */
interface CopyPlan {
  index: number;
  hash: string;
  src: string;
  dest: string;
  user: string;
  mode: string;
}

/**
 * The template E2B's build body describes, as abx's `Template` (plus the copies to stage): every
 * step type, base and option abx cannot express is refused by name.
 */
function translate(
  body: Record<string, unknown>,
  resources: Build['resources'],
  staging: string,
  /** Why this daemon's sandboxes cannot have root inside, or undefined when they can. */
  noRoot: string | undefined,
  /** The template this one builds on (E2B's `fromTemplate`), as the caller may use it. */
  base?: E2bTemplateBase,
): { template: Template; copies: CopyPlan[]; steps: number[] } {
  if (body.fromImageRegistry !== undefined && body.fromImageRegistry !== null) {
    throw new InvalidArgumentError(
      "fromImageRegistry (registry credentials) is not supported by abx: the image must be on the daemon's Docker engine already (docker pull or docker load), named by fromImage without credentials; nothing was built",
    );
  }
  const given = body.fromImage;
  if (base && given !== undefined && given !== null && given !== '') {
    throw new InvalidArgumentError('give fromImage or fromTemplate, not both; nothing was built');
  }
  const image = base ? base.image : given;
  if (typeof image !== 'string' || image === '') {
    throw new InvalidArgumentError(
      "fromImage or fromTemplate is required: the Docker image to start from (Template().fromImage(...)), on the daemon's Docker engine, or a template to build on (Template().fromTemplate(...))",
    );
  }
  let template = Template.fromImage(image);
  // What the base gives its sandboxes (its image holds its files, not these); steps override.
  if (base && Object.keys(base.env).length > 0) template = template.setEnvs(base.env);
  if (base && base.user !== 'user') template = template.setUser(base.user);
  if (base && base.workdir !== DEFAULT_WORKDIR) template = template.setWorkdir(base.workdir);
  if (resources.cpu !== undefined || resources.memory !== undefined) {
    template = template.setResources(resources);
  }
  const steps = body.steps ?? [];
  if (!Array.isArray(steps)) throw new InvalidArgumentError('steps must be a list of steps');
  let user = base?.user ?? 'user';
  /** The last USER step named root: E2B's sandboxes would then run as root by default. */
  let endsAsRoot = false;
  let workdir = base && base.workdir !== DEFAULT_WORKDIR ? base.workdir : undefined;
  const copies: CopyPlan[] = [];
  // For each setup step abx runs, the E2B step (1-based, as the SDK's stack traces count) it is.
  const setupOf: number[] = [];
  const run = (index: number, command: string, as: string) => {
    template = template.runCmd(command, { user: as });
    setupOf.push(index + 1);
  };
  for (const [index, raw] of steps.entries()) {
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
      throw new InvalidArgumentError(`template step ${index + 1} must be an object { type, args }`);
    }
    const step = raw as Record<string, unknown>;
    const type = String(step.type);
    const args = stringArgs(step, index, type);
    switch (type) {
      case 'RUN': {
        const [command, as] = args;
        if (!command) throw refused(index, type, 'it has no command');
        const cd = workdir === undefined ? '' : `cd ${shellQuote(workdir)} && `;
        run(index, `${cd}${command}`, as || user);
        break;
      }
      case 'ENV': {
        if (args.length % 2 !== 0) throw refused(index, type, 'its args must be name, value pairs');
        const env: Record<string, string> = {};
        for (let i = 0; i < args.length; i += 2) env[args[i] as string] = args[i + 1] as string;
        template = template.setEnvs(env);
        break;
      }
      case 'WORKDIR': {
        const [path] = args;
        if (!path) throw refused(index, type, 'it names no folder');
        workdir = posix.resolve(workdir ?? '/home/user', path);
        template = template.setWorkdir(workdir);
        run(index, `mkdir -p ${shellQuote(workdir)}`, 'root');
        break;
      }
      case 'USER': {
        const [name] = args;
        if (!name) throw refused(index, type, 'it names no user');
        // USER root: the steps after it run as root (the build's root); the sandboxes keep
        // their user, with root inside allowed (below).
        endsAsRoot = name === 'root' || name === '0';
        if (endsAsRoot) {
          user = 'root';
          break;
        }
        user = name;
        template = template.setUser(name);
        break;
      }
      case 'COPY': {
        const [src, dest, as, mode] = args;
        if (!src || !dest) throw refused(index, type, 'it needs a source and a destination');
        if (/[*?[\]{}]/.test(src)) {
          throw refused(
            index,
            type,
            `its source ${JSON.stringify(src)} is a glob pattern; name a file or folder`,
          );
        }
        if (typeof step.filesHash !== 'string') {
          throw refused(index, type, 'it has no filesHash (the SDK sends one for every copy)');
        }
        const hash = checkFilesHash(step.filesHash);
        const to = posix.resolve(workdir ?? '/home/user', dest);
        const at = join(staging, String(index));
        // Filled from the upload before the build (stageCopies): the source inside it.
        const plan: CopyPlan = { index, hash, src, dest: to, user: as || user, mode: mode ?? '' };
        if (plan.mode !== '' && !/^0?[0-7]{3,4}$/.test(plan.mode)) {
          throw refused(index, type, `its mode ${JSON.stringify(plan.mode)} is not octal`);
        }
        copies.push(plan);
        template = template.copy(
          join(at, src),
          dest.endsWith('/') ? `${to}/${basename(src)}` : to,
          {
            user: plan.user,
          },
        );
        setupOf.push(index + 1);
        if (plan.mode !== '') run(index, `chmod ${plan.mode} ${shellQuote(to)}`, 'root');
        break;
      }
      default:
        throw refused(
          index,
          type,
          'abx builds RUN, COPY, ENV, WORKDIR and USER steps (and the installs and file steps the SDK makes of them)',
        );
    }
  }
  // As on E2B, the sandboxes have root and sudo, where this daemon can give them.
  if (noRoot === undefined) template = template.allowRoot();
  else if (endsAsRoot) {
    throw new InvalidArgumentError(
      `setUser('root') as the template's last user asks for sandboxes that run as root, which this daemon cannot give: ${noRoot}; end with setUser('user') (steps after setUser('root') still run as root at build time); nothing was built`,
    );
  }
  const start = body.startCmd;
  const ready = body.readyCmd;
  if (typeof start === 'string' && start !== '') {
    template = template.setStartCmd(
      workdir === undefined ? start : `cd ${shellQuote(workdir)} && ${start}`,
      typeof ready === 'string' && ready !== '' ? ready : undefined,
    );
  } else if (typeof ready === 'string' && ready !== '') {
    throw new InvalidArgumentError(
      'readyCmd without startCmd is not supported by abx: give setStartCmd(cmd, readyCmd); nothing was built',
    );
  }
  return { template, copies, steps: setupOf };
}

/** E2B's template build routes over one daemon's backend; builds are kept in memory and on disk. */
export class TemplateBuilds {
  /** The builds kept, oldest first; read from disk at the first call (the backend names where). */
  private builds: Map<string, Build> | undefined;
  private records: BuildRecords | undefined;
  private files: TemplateFiles | undefined;
  /** Running builds whose record waits to be written with their new log lines. */
  private readonly pending = new Map<string, NodeJS.Timeout>();

  private store(backend: E2bBackend): TemplateFiles {
    this.files ??= new TemplateFiles(backend.templateFilesDir());
    return this.files;
  }

  /** The builds, loaded once: one the last daemon left running reads as failed (records.load). */
  private kept(backend: E2bBackend): Map<string, Build> {
    if (this.builds) return this.builds;
    const dir = backend.templateFilesDir();
    this.records = new BuildRecords(join(dir, 'build-status'));
    const loaded = this.records.load((id) =>
      rmSync(join(dir, 'builds', id), { recursive: true, force: true }),
    );
    this.builds = new Map(loaded.map((b) => [b.id, b]));
    return this.builds;
  }

  /**
   * The daemon stops: each running build is recorded as stopped now (its work dies with the
   * daemon, or fails as the provider closes, and either way does not finish).
   */
  stop(): void {
    for (const build of this.builds?.values() ?? []) {
      if (build.status !== 'building') continue;
      appendLog(build, INTERRUPTED, 'error');
      build.status = 'error';
      build.reason = { message: INTERRUPTED };
      try {
        this.save(build);
      } catch {
        // Read as stopped at the next start all the same (records.load).
      }
    }
  }

  /** Writes `build`'s record now (and drops a write that was waiting). */
  private save(build: Build): void {
    clearTimeout(this.pending.get(build.id));
    this.pending.delete(build.id);
    this.records?.save(build);
  }

  /** The build `id` as the caller may see it: its own (an admin: any); else 404. */
  private visible(call: TemplateBuildCall): Build {
    const id = call.params.buildID as string;
    const build = this.kept(call.backend).get(id);
    if (
      !build ||
      build.template !== call.params.id ||
      (!call.caller.admin && build.owner !== call.caller.keyId)
    ) {
      throw buildNotFound(id);
    }
    return build;
  }

  /** `POST /v3/templates` (and v2): a new build of the template `name`, waiting for its steps. */
  request = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const given = call.body.name ?? call.body.alias;
    if (typeof given !== 'string' || given === '') {
      throw new InvalidArgumentError('name is required: the template name, such as my-template');
    }
    const [name, tag] = given.split(':', 2) as [string, string | undefined];
    const tags = [...(tag ? [tag] : []), ...((call.body.tags as string[] | undefined) ?? [])];
    if (!TEMPLATE_NAME_PATTERN.test(name) || name.length > 64 || name === 'base') {
      throw new InvalidArgumentError(
        `template name ${JSON.stringify(name)} must be letters, digits, ".", "_" and "-" (64 at most, not base), such as my-template`,
      );
    }
    const other = tags.find((t) => t !== 'default');
    if (other !== undefined) {
      throw new InvalidArgumentError(
        `tag ${JSON.stringify(other)} is not supported by abx: a template has one build, its latest (the tag default); build under another name instead`,
      );
    }
    const resources: Build['resources'] = {};
    if (call.body.cpuCount !== undefined) resources.cpu = Number(call.body.cpuCount);
    if (call.body.memoryMB !== undefined) resources.memory = `${Number(call.body.memoryMB)}M`;
    const build: Build = {
      id: randomUUID(),
      template: name,
      owner: call.caller.keyId,
      status: 'waiting',
      resources,
      logs: [],
      logChars: 0,
      createdAt: Date.now(),
    };
    const builds = this.kept(call.backend);
    builds.set(build.id, build);
    this.save(build);
    // Oldest first (a Map keeps insertion order); a running build is never forgotten.
    for (const [id, old] of builds) {
      if (builds.size <= MAX_BUILDS) break;
      if (old.status === 'building') continue;
      builds.delete(id);
      this.records?.remove(id);
    }
    return {
      status: 202,
      body: {
        templateID: name,
        buildID: build.id,
        tags: ['default'],
        names: [name],
        aliases: [name],
        public: call.caller.admin,
      },
    };
  };

  /** `GET /templates/{id}/files/{hash}`: whether this key uploaded them; else a one-time link. */
  fileLink = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const hash = checkFilesHash(call.params.hash as string);
    const files = this.store(call.backend);
    if (files.present(call.caller.keyId, hash)) return { status: 200, body: { present: true } };
    const token = files.uploadToken(call.caller.keyId, hash);
    const url = `${call.origin}/templates/${encodeURIComponent(call.params.id as string)}/files/${hash}?upload=${token}`;
    return { status: 201, body: { present: false, url } };
  };

  /** The upload a link names (PUT, the tar as the body); handled outside JSON routing. */
  upload(backend: E2bBackend) {
    return this.store(backend);
  }

  /**
   * The template E2B's `fromTemplate` names, as the caller may build on it (backend.templateBase:
   * another key's private template is 404 as an unknown one); undefined when none is named.
   */
  private async baseOf(
    call: TemplateBuildCall,
  ): Promise<{ name: string; base: E2bTemplateBase } | undefined> {
    const from = call.body.fromTemplate;
    if (from === undefined || from === null || from === '') return undefined;
    const [name, tag] = typeof from === 'string' ? from.split(':', 2) : [];
    if (!name || !TEMPLATE_NAME_PATTERN.test(name) || (tag !== undefined && tag !== 'default')) {
      throw new InvalidArgumentError(
        `fromTemplate ${JSON.stringify(from)} must name a template (letters, digits, ".", "_" and "-", with the tag default at most), such as my-base; nothing was built`,
      );
    }
    return { name, base: await call.backend.templateBase(name, call.caller) };
  }

  /** `POST /v2/templates/{id}/builds/{buildID}`: translate the steps, then build in the background. */
  start = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const build = this.visible(call);
    if (build.status !== 'waiting') {
      throw new TemplateConflictError(
        `template build ${build.id} was started already (${build.status}); request a new build`,
      );
    }
    const from = await this.baseOf(call);
    // Checked again after the wait: another request may have started it meanwhile.
    if (build.status !== 'waiting') {
      throw new TemplateConflictError(
        `template build ${build.id} was started already (${build.status}); request a new build`,
      );
    }
    const staging = join(call.backend.templateFilesDir(), 'builds', build.id);
    const { template, copies, steps } = translate(
      call.body,
      build.resources,
      staging,
      call.backend.rootUnavailable
        ? call.backend.rootUnavailable()
        : 'this daemon gives no sandbox root',
      from?.base,
    );
    const files = this.store(call.backend);
    for (const copy of copies) {
      if (!files.present(call.caller.keyId, copy.hash)) {
        throw refused(
          copy.index,
          'COPY',
          `its files (hash ${copy.hash}) were not uploaded by this key`,
        );
      }
    }
    // Its uploads stay until it ends, whatever a prune finds meanwhile.
    const release = files.hold(
      call.caller.keyId,
      copies.map((c) => c.hash),
    );
    build.status = 'building';
    try {
      this.save(build);
    } catch (error) {
      build.status = 'waiting';
      release();
      throw error;
    }
    files.pruneIfDue();
    void this.run(
      build,
      call,
      template.toYaml(build.template),
      copies,
      steps,
      staging,
      from?.name,
    ).finally(release);
    return { status: 202, body: {} };
  };

  /** Adds a line to the build's log; its record is written with the lines of the next seconds. */
  private log(
    build: Build,
    message: string,
    level: BuildLogEntry['level'] = 'info',
    step?: number,
  ) {
    appendLog(build, message, level, step);
    if (this.pending.has(build.id)) return;
    const timer = setTimeout(() => {
      this.pending.delete(build.id);
      try {
        this.records?.save(build);
      } catch {
        // A full disk loses the latest lines on disk only; the build's end writes again.
      }
    }, BUILD_RECORD_FLUSH_MS);
    timer.unref();
    this.pending.set(build.id, timer);
  }

  private async run(
    build: Build,
    call: TemplateBuildCall,
    yaml: string,
    copies: CopyPlan[],
    steps: number[],
    staging: string,
    /** The template it builds on (E2B's `fromTemplate`). */
    fromTemplate?: string,
  ): Promise<void> {
    const files = this.store(call.backend);
    try {
      for (const copy of copies) {
        const at = join(staging, String(copy.index));
        mkdirSync(at, { recursive: true, mode: 0o755 });
        await files.extract(call.caller.keyId, copy.hash, at);
        sourceInside(at, copy.src);
      }
      this.log(build, `building template ${build.template} with abx's template builder`);
      await call.backend.buildTemplate(
        yaml,
        call.caller,
        (event: BuildProgress) => {
          if (build.status !== 'building') return;
          const step = event.step === undefined ? undefined : steps[event.step];
          this.log(build, event.text, 'info', step);
        },
        staging,
        fromTemplate,
      );
      // Recorded as stopped with the daemon (stop()): what ends after that changes nothing.
      if (build.status !== 'building') return;
      this.log(build, `template ${build.template} is built`);
      build.status = 'ready';
    } catch (error) {
      if (build.status !== 'building') return;
      const details = error instanceof SandboxError ? error.details : {};
      const index = typeof details.step === 'number' ? steps[details.step] : undefined;
      const message = (error as Error).message;
      this.log(build, message, 'error', index);
      build.reason = { message, ...(index === undefined ? {} : { step: String(index) }) };
      build.status = 'error';
    } finally {
      rmSync(staging, { recursive: true, force: true });
      try {
        this.save(build);
      } catch {
        // The status in memory is right; on disk the build stays running, read as stopped later.
      }
    }
  }

  /** `GET /templates/{id}/builds/{buildID}/status?logsOffset=N`: the lines from N on. */
  status = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const build = this.visible(call);
    const offset = Number(call.query.get('logsOffset') ?? 0);
    if (!Number.isInteger(offset) || offset < 0) {
      throw new InvalidArgumentError('logsOffset must be a whole number, 0 or more');
    }
    const logEntries = build.logs.slice(offset);
    return {
      status: 200,
      body: {
        templateID: build.template,
        buildID: build.id,
        status: build.status,
        logs: logEntries.map((e) => `${e.timestamp} ${e.level}: ${e.message}`),
        logEntries,
        ...(build.reason ? { reason: { ...build.reason, logEntries: [] } } : {}),
      },
    };
  };

  /** `GET /templates/{id}/builds/{buildID}/logs`: the lines from `cursor` (a line number). */
  logs = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const build = this.visible(call);
    const offset = Number(call.query.get('cursor') ?? 0);
    const limit = Number(call.query.get('limit') ?? 100);
    return { status: 200, body: { logs: build.logs.slice(offset, offset + Math.max(0, limit)) } };
  };

  /** `GET /templates/aliases/{alias}` (`Template.exists`): the template if the caller may use it. */
  alias = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const name = call.params.alias as string;
    if (!(await call.backend.template(name, call.caller))) {
      throw new NotFoundError(`template ${JSON.stringify(name)} not found`);
    }
    return { status: 200, body: { templateID: name, public: true } };
  };

  /** `GET /templates/{id}/tags`: one tag, `default`, on the latest build of a usable template. */
  tags = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const name = call.params.id as string;
    if (!(await call.backend.template(name, call.caller))) {
      throw new NotFoundError(`template ${JSON.stringify(name)} not found`);
    }
    const latest = [...this.kept(call.backend).values()]
      .filter((b) => b.template === name && b.status === 'ready')
      .at(-1);
    return {
      status: 200,
      body: [
        {
          tag: 'default',
          buildID: latest?.id ?? '00000000-0000-0000-0000-000000000000',
          createdAt: new Date(latest?.createdAt ?? 0).toISOString(),
        },
      ],
    };
  };

  /**
   * `POST /templates/tags` (`assignTags`), `DELETE /templates/tags` (`removeTags`): refused, by
   * name. abx keeps one build per template, its latest: there is no older build a tag could name,
   * and `default` always names the latest. The same answer whether the template exists or not.
   * (A DELETE's body is not read here: removing names no tags.)
   */
  tagEdit = async (call: TemplateBuildCall): Promise<TemplateBuildAnswer> => {
    const target = call.body.target ?? call.body.name;
    const tags = Array.isArray(call.body.tags) ? call.body.tags.map(String) : [];
    const what = `${tags.length > 0 ? `tags ${tags.map((t) => JSON.stringify(t)).join(', ')}` : 'tags'}${typeof target === 'string' ? ` of ${JSON.stringify(target)}` : ''}`;
    throw new InvalidArgumentError(
      `${call.body.target === undefined ? 'removing' : 'assigning'} ${what} is not supported by abx: a template keeps one build, its latest, whose only tag is default; to keep builds side by side, build each under a name of its own (such as my-template-v2); nothing was changed`,
    );
  };
}
