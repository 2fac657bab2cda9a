/** What the sandboxes list and a sandbox's page can do to a sandbox, each asked first where it destroys something. */
import { api, type SandboxInfo, sandboxPath } from './api.js';
import { ask } from './components/dialog.js';
import { disconnect } from './gateway.js';
import { applySandbox } from './live.js';

export function killSandbox(sandbox: SandboxInfo, after?: () => void): void {
  ask({
    title: `Kill sandbox ${sandbox.sandboxId}?`,
    message:
      'Every process in it ends and its files are gone (a snapshot saves them first). This cannot be undone.',
    confirm: 'Kill',
    danger: true,
    async run() {
      const { sandbox: ended } = await api<{ sandbox: SandboxInfo }>(
        'DELETE',
        sandboxPath(sandbox.sandboxId),
      );
      disconnect(sandbox.sandboxId);
      applySandbox(ended);
      after?.();
    },
  });
}

export async function pauseSandbox(sandbox: SandboxInfo): Promise<void> {
  applySandbox(await api<SandboxInfo>('POST', sandboxPath(sandbox.sandboxId, '/pause'), {}));
  disconnect(sandbox.sandboxId);
}

/** Hibernating ends its processes (the disk is kept): asked first. */
export function hibernateSandbox(sandbox: SandboxInfo): void {
  ask({
    title: `Hibernate sandbox ${sandbox.sandboxId}?`,
    message: 'Its processes end; its disk and environment are kept until it is resumed.',
    confirm: 'Hibernate',
    danger: true,
    async run() {
      applySandbox(
        await api<SandboxInfo>('POST', sandboxPath(sandbox.sandboxId, '/pause'), { memory: false }),
      );
      disconnect(sandbox.sandboxId);
    },
  });
}

export async function resumeSandbox(sandbox: SandboxInfo): Promise<void> {
  applySandbox(await api<SandboxInfo>('POST', sandboxPath(sandbox.sandboxId, '/resume'), {}));
}

export function extendSandbox(sandbox: SandboxInfo): void {
  const left = Math.max(1, Math.round((Date.parse(sandbox.expiresAt) - Date.now()) / 60_000));
  ask({
    title: `Timeout of ${sandbox.sandboxId}`,
    fields: [
      {
        name: 'minutes',
        label: 'Minutes left from now',
        type: 'number',
        min: 1,
        required: true,
        value: String(Math.max(30, left)),
        hint: `Now: about ${left} min left. At most 24 h.`,
      },
    ],
    confirm: 'Set timeout',
    async run({ minutes }) {
      const value = Number(minutes);
      if (!Number.isFinite(value) || value <= 0)
        throw new Error('give a number of minutes above 0');
      applySandbox(
        await api<SandboxInfo>('POST', sandboxPath(sandbox.sandboxId, '/timeout'), {
          timeoutMs: Math.round(value * 60_000),
        }),
      );
    },
  });
}

export function snapshotSandbox(sandbox: SandboxInfo): void {
  ask({
    title: `Snapshot ${sandbox.sandboxId} as a template`,
    message:
      "Its home (with an image, its whole filesystem) becomes a template of this key's own: only this key and admin keys see it and start it, until an admin publishes it. A template of that name that is this key's is replaced.",
    fields: [{ name: 'name', label: 'Template name', required: true, value: '' }],
    confirm: 'Save snapshot',
    async run({ name }) {
      await api('POST', sandboxPath(sandbox.sandboxId, '/snapshot'), { name: name.trim() });
    },
  });
}
