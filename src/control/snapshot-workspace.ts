/**
 * A snapshot of a sandbox with a workspace (docs/workspaces.md, "Fork and snapshots"): the
 * snapshot keeps the host folder's path, where the sandbox saw it and a copy of its upper layer
 * (its changes); a sandbox created from it mounts the folder again over a copy of that layer.
 */
import { mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { TemplateSpec } from '../commands/template.js';
import { InvalidArgumentError } from '../errors.js';
import type { SandboxSpec } from '../providers/provider.js';
import { copyTree, UPLOAD_INFO_FILE, uploadedWorkspace } from './workspace-uploads.js';

/** What a snapshot keeps of its sandbox's workspace (besides the layer, in its folder). */
export type SnapshotWorkspace = NonNullable<TemplateSpec['snapshotWorkspace']>;

/** Where a snapshot keeps its workspace's upper layer, in the template's folder. */
export function snapshotLayerDir(templateDir: string): string {
  return join(templateDir, 'workspace');
}

/**
 * Where a snapshot of a sandbox with an uploaded workspace keeps its copy of the base (`base`,
 * `upload.json`), in the template's folder beside the layer (`layerDir`).
 */
export function snapshotBaseDir(layerDir: string): string {
  return join(dirname(layerDir), 'workspace-upload');
}

/** A create's uploaded workspace: an upload's id, or a snapshot's kept base (`kept`). */
export interface UploadedRequest {
  upload: string;
  path: string;
  kept?: {
    /** The snapshot's copy: `base` and `upload.json`. */
    base: string;
    since: number;
    layer: { dir: string; uid: number };
  };
}

/**
 * A snapshot's kept uploaded workspace (its base's copy and its layer), for a create from
 * template `spec` whose kept layer is `layerDir`; undefined for any other template.
 */
export function snapshotUpload(
  spec: TemplateSpec,
  layerDir: string | undefined,
): UploadedRequest['kept'] {
  const kept = spec.snapshotWorkspace;
  if (!kept?.uploaded || !layerDir) return undefined;
  return {
    base: snapshotBaseDir(layerDir),
    since: kept.since,
    layer: { dir: layerDir, uid: kept.uid },
  };
}

/**
 * For a snapshot of a sandbox whose workspace's base `from` was uploaded: copies the base and
 * what it says of its upload beside the snapshot's layer (`layerDir`), a copy of its own (the
 * upload's base goes with its last sandbox); what the snapshot keeps of the upload. Undefined:
 * `from` is a host folder, not copied.
 */
export async function keepUploadedBase(
  from: string,
  layerDir: string,
): Promise<{ uploadId: string; since: number | null; uploadedAt: number } | undefined> {
  const info = uploadedWorkspace(from);
  if (!info) return undefined;
  const into = snapshotBaseDir(layerDir);
  mkdirSync(into, { recursive: true, mode: 0o700 });
  await copyTree(from, join(into, 'base'));
  writeFileSync(join(into, UPLOAD_INFO_FILE), readFileSync(join(dirname(from), UPLOAD_INFO_FILE)), {
    mode: 0o600,
  });
  return { uploadId: info.uploadId, since: info.since, uploadedAt: info.uploadedAt };
}

/**
 * The workspace a create from template `spec` asks for: its own `requested`, or the snapshot's
 * `{ from, path }` (to be checked and authorized as a create's own, for the key that creates).
 * A create from a snapshot with a workspace that names its own is refused: the kept changes are
 * of that folder, at that path.
 */
export function snapshotWorkspaceRequest(requested: unknown, spec: TemplateSpec): unknown {
  const kept = spec.snapshotWorkspace;
  if (!kept) return requested;
  if (requested !== undefined && requested !== null) {
    throw new InvalidArgumentError(
      `template '${spec.name}' is a snapshot of a sandbox with a workspace (${kept.from} at ${kept.path}), whose changes it keeps: a create from it mounts that folder again and cannot name a workspace of its own; leave workspace out (or create from the snapshot's template)`,
    );
  }
  // An uploaded one: the snapshot's copy of the base (no folder of the daemon's host).
  if (kept.uploaded) return { upload: kept.uploaded.uploadId, path: kept.path };
  return { from: kept.from, path: kept.path };
}

/**
 * A checked workspace of a create from template `spec`: a snapshot's gets its kept layer (in
 * `layerDir`) and since; the host folder must still be there (400 naming it). Others as given.
 */
export function withSnapshotLayer<T extends { from: string; path: string }>(
  workspace: T,
  spec: TemplateSpec,
  layerDir: string | undefined,
): T & Pick<NonNullable<SandboxSpec['workspace']>, 'since' | 'layer'> {
  const kept = spec.snapshotWorkspace;
  if (!kept || !layerDir) return workspace;
  if (!statSync(kept.from, { throwIfNoEntry: false })?.isDirectory()) {
    throw new InvalidArgumentError(
      `template '${spec.name}' is a snapshot of a sandbox whose workspace was ${kept.from}, which is not a folder on the daemon's host any more: put the folder back there, or create from another template`,
    );
  }
  return { ...workspace, since: kept.since, layer: { dir: layerDir, uid: kept.uid } };
}
