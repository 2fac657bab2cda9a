/**
 * A snapshot of a sandbox with a workspace (docs/workspaces.md, "Fork and snapshots"): the
 * snapshot keeps the host folder's path, where the sandbox saw it and a copy of its upper layer
 * (its changes); a sandbox created from it mounts the folder again over a copy of that layer.
 */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import type { TemplateSpec } from '../commands/template.js';
import { InvalidArgumentError } from '../errors.js';
import type { SandboxSpec } from '../providers/provider.js';

/** What a snapshot keeps of its sandbox's workspace (besides the layer, in its folder). */
export type SnapshotWorkspace = NonNullable<TemplateSpec['snapshotWorkspace']>;

/** Where a snapshot keeps its workspace's upper layer, in the template's folder. */
export function snapshotLayerDir(templateDir: string): string {
  return join(templateDir, 'workspace');
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
