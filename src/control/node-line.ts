import { NodeLineError } from '../errors.js';
import type { SandboxHandle, SandboxNode, SandboxProvider } from '../providers/provider.js';
import { envdRequest } from './envd-request.js';

/** The line (major version) of a Node version such as `v24.22.3`; undefined if it is not one. */
export function nodeLineOf(version: string): number | undefined {
  const major = /^v?(\d+)\./.exec(version)?.[1];
  return major === undefined ? undefined : Number(major);
}

/** Where a provider that cannot tell beforehand gets its sandboxes' Node, for the message. */
function unknownSource(provider: SandboxProvider): SandboxNode {
  return {
    version: '',
    source:
      provider.name === 'kubernetes'
        ? "the runtime image's Node (the init container's image: `abx kubernetes runtime-image` copies the Node it runs on)"
        : `the Node that the ${provider.name} provider gives its sandboxes`,
    change: (line) =>
      provider.name === 'kubernetes'
        ? `build and push the runtime image with Node ${line} (\`abx kubernetes runtime-image REGISTRY/abx-runtime --push\`, run on Node ${line}) and give it to the daemon (--kube-runtime-image)`
        : `give the ${provider.name} provider's sandboxes Node ${line}`,
  };
}

function mismatch(
  template: string,
  needed: number,
  node: SandboxNode,
  found: string,
  when: string,
): NodeLineError {
  return new NodeLineError(
    `template '${template}' needs Node ${needed} (runtime: { node: ${needed} }), but ${when} run Node ${found}: ${node.source}. To run Node ${needed} there, ${node.change(needed)}; or set runtime.node to the line the template's code runs on`,
    { details: { needed, found } },
  );
}

/**
 * At a build: throws {@link NodeLineError} when the template names a Node line and the provider
 * says its sandboxes (with an image or without) would run another. A provider that cannot tell
 * beforehand passes here; each create checks the started sandbox.
 */
export async function checkNodeLine(
  template: string,
  needed: number | undefined,
  provider: SandboxProvider,
  image: boolean,
): Promise<void> {
  if (needed === undefined || !provider.sandboxNode) return;
  const node = await provider.sandboxNode(image);
  if (nodeLineOf(node.version) !== needed) {
    throw mismatch(template, needed, node, node.version, 'its sandboxes here would');
  }
}

/**
 * At a create: asks the started sandbox's envd which Node it runs (`GET /info`), and throws
 * {@link NodeLineError} when it is another line than the template needs. The truth for every
 * provider, whatever changed since the build (the daemon restarted on another Node, the host's
 * upgraded).
 */
export async function verifySandboxNode(
  template: string,
  needed: number,
  provider: SandboxProvider,
  image: boolean,
  handle: SandboxHandle,
  controlToken: string,
): Promise<void> {
  const { status, body } = await envdRequest<{ node?: string }>(
    handle.envdSocket,
    controlToken,
    'GET',
    '/info',
    undefined,
    10_000,
  );
  const found = body.node;
  if (status !== 200 || typeof found !== 'string') {
    throw new NodeLineError(
      `template '${template}' needs Node ${needed}, and the new sandbox's envd did not say which Node it runs (GET /info answered ${status})`,
      { details: { needed } },
    );
  }
  if (nodeLineOf(found) === needed) return;
  const node = provider.sandboxNode
    ? await provider.sandboxNode(image).catch(() => unknownSource(provider))
    : unknownSource(provider);
  throw mismatch(template, needed, node, found, 'its sandboxes here');
}
