import { existsSync, readdirSync, statSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { Parser, type ReadEntry, create as tarCreate } from 'tar';
import { END_OF_ARCHIVE, entryHeader, padding } from '../../../runtime/envd/tar-format.js';
import { InvalidArgumentError, SandboxError, TemplateBuildError } from '../../errors.js';
import { copySource } from '../../util/copy-source.js';
import type { ImageSource, ImageStore, SandboxHandle } from '../provider.js';
import { SANDBOX_LABEL, SANDBOXES_DIR_LABEL } from './container-config.js';
import { dockerMessage, engineAddress, engineError, imageNotFound, statusOf } from './engine.js';
import {
  type ContainerInspectInfo,
  type DockerEngine,
  type EngineContainer,
  followProgress,
  type ImageInspectInfo,
} from './engine-client.js';
import { splitTag } from './image-reference.js';
import { addSandboxUser, SANDBOX_USER_ID } from './passwd.js';
import { pushImage } from './registry-push.js';
import { copyArchive } from './sandbox-archive.js';

/** Label of an image `prepare` made: the source image's id it was made from, and the user added. */
const PREPARED_FROM_LABEL = 'abx.prepared-from';
const PREPARED_USER_LABEL = 'abx.user';
/** Label of an image `commit` made from a build sandbox: the template image's tag. */
export const TEMPLATE_LABEL = 'abx.template';

/** The bytes of one regular file of a container's file system; undefined when it is not there. */
async function readContainerFile(
  container: EngineContainer,
  path: string,
  address: string,
): Promise<string | undefined> {
  let stream: Readable;
  try {
    stream = await container.getArchive({ path });
  } catch (error) {
    if (statusOf(error) === 404) return undefined;
    throw engineError(error, `cannot read ${path} of the image`, address);
  }
  return new Promise((resolvePromise, reject) => {
    let content: string | undefined;
    let kind: string | undefined;
    const parser = new Parser({
      onReadEntry: (entry: ReadEntry) => {
        kind ??= entry.type;
        if (entry.type !== 'File' || content !== undefined) {
          entry.resume();
          return;
        }
        const chunks: Buffer[] = [];
        entry.on('data', (chunk: Buffer) => chunks.push(chunk));
        entry.on('end', () => {
          content = Buffer.concat(chunks).toString('utf8');
        });
      },
    });
    parser.on('error', reject);
    parser.on('end', () => {
      if (kind !== undefined && kind !== 'File') {
        reject(new SandboxError(`${path} in the image is a ${kind}, not a regular file`));
      } else resolvePromise(content);
    });
    stream.on('error', reject);
    stream.pipe(parser as unknown as NodeJS.WritableStream);
  });
}

/** A tar of files and folders to unpack at `/`: account files (root's, 0644) and the user's home. */
function accountArchive(files: { path: string; text: string }[], home: string): Readable {
  const now = Math.floor(Date.now() / 1000);
  const parts: Buffer[] = [];
  for (const { path, text } of files) {
    const body = Buffer.from(text);
    parts.push(
      entryHeader({
        name: Buffer.from(path.replace(/^\//, '')),
        type: '0',
        mode: 0o644,
        uid: 0,
        gid: 0,
        size: body.length,
        mtime: now,
      }),
      body,
      padding(body.length),
    );
  }
  parts.push(
    entryHeader({
      name: Buffer.from(`${home.replace(/^\//, '')}/`),
      type: '5',
      mode: 0o700,
      uid: SANDBOX_USER_ID,
      gid: SANDBOX_USER_ID,
      size: 0,
      mtime: now,
    }),
    END_OF_ARCHIVE,
  );
  return Readable.from(parts);
}

/**
 * Waits for the end of a build's JSON progress stream: its output's end, or the first error in
 * it (with that output as its `cause`).
 */
async function followBuild(stream: Readable): Promise<string> {
  const output: string[] = [];
  try {
    await followProgress(stream, (event) => {
      if (event.stream) output.push(event.stream);
    });
  } catch (error) {
    throw new Error((error as Error).message, { cause: output.join('').slice(-3000) });
  }
  return output.join('').slice(-3000);
}

/**
 * Images on a Docker engine for image templates: `prepare` checks an image (or builds a
 * Dockerfile) and adds the template's user without running anything in it (no shell needed);
 * `commit` saves a build sandbox; `remove` drops an image this store made.
 */
export class DockerImageStore implements ImageStore {
  private readonly address: string;

  constructor(private readonly docker: DockerEngine) {
    this.address = engineAddress(docker);
  }

  async prepare(source: ImageSource, options: { user: string; tag: string }): Promise<string> {
    if (!('dockerfile' in source)) return this.addUser(source.image, options);
    const built = await this.build(source.dockerfile, options.tag);
    try {
      return await this.addUser(built, options);
    } finally {
      // Only the prepared tag stays; the built image lives on as its parent layer.
      await this.docker
        .getImage(built)
        .remove({ noprune: true })
        .catch(() => undefined);
    }
  }

  /** `from` with the user added (uid 1000, its home), saved as `options.tag`. */
  private async addUser(from: string, options: { user: string; tag: string }): Promise<string> {
    const image = await this.inspectImage(from);
    const labels = image.Config?.Labels ?? {};
    // Made already from this very image for this user: nothing to do.
    const existing = await this.inspectImage(options.tag).catch(() => undefined);
    const made = existing?.Config?.Labels ?? {};
    if (made[PREPARED_FROM_LABEL] === image.Id && made[PREPARED_USER_LABEL] === options.user) {
      return options.tag;
    }
    if (options.user === 'root') {
      await this.tag(image.Id, options.tag);
      return options.tag;
    }

    const config = image.Config ?? {};
    const hasCommand = (config.Cmd?.length ?? 0) > 0 || (config.Entrypoint?.length ?? 0) > 0;
    let container: EngineContainer;
    try {
      // Never started: only its file system is read and written. An image with no command at all
      // (`docker import`) needs one to make a container; it keeps `/bin/sh` as its CMD.
      container = await this.docker.createContainer({
        Image: image.Id,
        ...(hasCommand ? {} : { Cmd: ['/bin/sh'] }),
        Labels: { 'abx.prepare': options.tag },
        NetworkDisabled: true,
      });
    } catch (error) {
      throw engineError(error, `cannot prepare image ${from}`, this.address);
    }
    try {
      const passwd = await readContainerFile(container, '/etc/passwd', this.address);
      const group = await readContainerFile(container, '/etc/group', this.address);
      const changed = addSandboxUser(from, options.user, passwd, group);
      const files = [
        ...(changed.passwd ? [{ path: '/etc/passwd', text: changed.passwd }] : []),
        ...(changed.group ? [{ path: '/etc/group', text: changed.group }] : []),
      ];
      await container
        .putArchive(accountArchive(files, `/home/${options.user}`), { path: '/' })
        .catch((error: unknown) => {
          throw engineError(
            error,
            `cannot add user ${options.user} to image ${from}`,
            this.address,
          );
        });
      const { repo, tag } = splitTag(options.tag);
      await container
        .commit(
          { repo, tag, comment: `abx: user ${options.user}` },
          // The image's own configuration, not the throwaway container's.
          {
            ...config,
            ...(hasCommand ? {} : { Cmd: ['/bin/sh'] }),
            Labels: {
              ...labels,
              [PREPARED_FROM_LABEL]: image.Id,
              [PREPARED_USER_LABEL]: options.user,
            },
          },
        )
        .catch((error: unknown) => {
          throw engineError(error, `cannot save image ${options.tag}`, this.address);
        });
    } finally {
      await container.remove({ force: true }).catch(() => undefined);
    }
    return options.tag;
  }

  async commit(handle: SandboxHandle, tag: string): Promise<string> {
    if (!handle.container) {
      throw new InvalidArgumentError(`sandbox handle of ${handle.provider} names no container`);
    }
    const container = this.docker.getContainer(handle.container);
    let info: ContainerInspectInfo;
    try {
      info = await container.inspect();
    } catch (error) {
      throw engineError(error, `cannot commit container ${handle.container}`, this.address);
    }
    // The configuration of the image the build started from. Docker fills what the body leaves
    // unset from the build container's (its command, labels, environment): so the body sets an
    // entrypoint and a command, blanks the sandbox labels (a container of this image started by
    // hand must not look like an abx sandbox to sweepOrphans) and the build's sandbox id.
    const base = await this.inspectImage(info.Image);
    const config = base.Config ?? {};
    const env = (config.Env ?? []).filter((entry) => !entry.startsWith('ABX_SANDBOX_ID='));
    const { repo, tag: version } = splitTag(tag);
    try {
      await container.commit(
        { repo, tag: version, pause: true },
        {
          ...config,
          Entrypoint: config.Entrypoint ?? [],
          Cmd: config.Cmd ?? [],
          Env: [...env, 'ABX_SANDBOX_ID='],
          Labels: {
            ...(config.Labels ?? {}),
            [SANDBOX_LABEL]: '',
            [SANDBOXES_DIR_LABEL]: '',
            [TEMPLATE_LABEL]: tag,
          },
        },
      );
    } catch (error) {
      throw engineError(
        error,
        `cannot commit container ${handle.container} as ${tag}`,
        this.address,
      );
    }
    return tag;
  }

  async copyIn(handle: SandboxHandle, from: string, to: string, user: string): Promise<void> {
    const _stats = copySource(from);
    if (!handle.container) {
      throw new InvalidArgumentError(`sandbox handle of ${handle.provider} names no container`);
    }
    const container = this.docker.getContainer(handle.container);
    const owner = user === 'root' ? { uid: 0, gid: 0 } : await this.userIds(container, user);
    await container
      .putArchive(Readable.from(copyArchive(from, to, owner)), { path: '/' })
      .catch((error: unknown) => {
        throw engineError(error, `cannot copy ${from} to ${to}`, this.address);
      });
  }

  /** The uid and gid of `user` in a container's /etc/passwd (read through the engine). */
  private async userIds(
    container: EngineContainer,
    user: string,
  ): Promise<{ uid: number; gid: number }> {
    const passwd = (await readContainerFile(container, '/etc/passwd', this.address)) ?? '';
    for (const line of passwd.split('\n')) {
      const [name, , uid, gid] = line.split(':');
      if (name === user && /^\d+$/.test(uid ?? '') && /^\d+$/.test(gid ?? '')) {
        return { uid: Number(uid), gid: Number(gid) };
      }
    }
    throw new InvalidArgumentError(
      `user ${JSON.stringify(user)} is not in the image's /etc/passwd: create it in an earlier step, or copy as root or as the template's user`,
    );
  }

  async remove(image: string): Promise<void> {
    try {
      // By name: an image a sandbox still runs from is only untagged; its layers go with it.
      await this.docker.getImage(image).remove({ noprune: false });
    } catch (error) {
      const status = statusOf(error);
      if (status === 404) return;
      if (status === 409) {
        await this.docker
          .getImage(image)
          .remove({ force: true })
          .catch((again: unknown) => {
            if (statusOf(again) !== 404)
              throw engineError(again, `cannot remove image ${image}`, this.address);
          });
        return;
      }
      throw engineError(error, `cannot remove image ${image}`, this.address);
    }
  }

  async publish(image: string, repository: string): Promise<string> {
    const id = (await this.inspectImage(image)).Id.replace(/^sha256:/, '').slice(0, 16);
    return (await pushImage(this.docker, image, `${repository}:${id}`)).reference;
  }

  /** An image's inspection; a missing one is a NotFoundError saying how to get it. */
  async inspectImage(image: string): Promise<ImageInspectInfo> {
    try {
      return await this.docker.getImage(image).inspect();
    } catch (error) {
      if (statusOf(error) === 404) throw imageNotFound(image, error);
      throw engineError(error, `cannot inspect image ${image}`, this.address);
    }
  }

  private async tag(image: string, reference: string): Promise<void> {
    const { repo, tag } = splitTag(reference);
    await this.docker
      .getImage(image)
      .tag({ repo, tag })
      .catch((error: unknown) => {
        throw engineError(error, `cannot tag ${image} as ${reference}`, this.address);
      });
  }

  /** Builds a Dockerfile with its folder as the context (host network: builds download). */
  private async build(dockerfile: string, tag: string): Promise<string> {
    const file = resolve(dockerfile);
    if (!existsSync(file) || !statSync(file).isFile()) {
      throw new InvalidArgumentError(`Dockerfile ${file} does not exist`);
    }
    const context = dirname(file);
    const { repo, tag: version } = splitTag(tag);
    const built = `${repo}:${version}-build`;
    const tarball = tarCreate({ cwd: context, portable: true }, readdirSync(context));
    let stream: Readable;
    try {
      stream = await this.docker.buildImage(tarball as unknown as Readable, {
        t: built,
        dockerfile: basename(file),
        networkmode: 'host',
        rm: true,
        forcerm: true,
      });
    } catch (error) {
      throw engineError(error, `cannot build ${file}`, this.address);
    }
    try {
      await followBuild(stream);
    } catch (error) {
      const output = (error as Error).cause;
      throw new TemplateBuildError(
        `building ${file} failed: ${dockerMessage(error)}${typeof output === 'string' && output ? `; its output ends:\n${output}` : ''}`,
        { details: { command: `docker build ${context}`, output: String(output ?? '') } },
      );
    }
    return built;
  }
}
