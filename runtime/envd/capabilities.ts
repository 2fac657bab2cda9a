import type { IncomingMessage } from 'node:http';
import {
  CAPABILITIES,
  type Capability,
  capabilityOfSegment,
  capabilityRefusal,
} from '../protocol/capabilities.js';
import { CapabilityError, InvalidArgumentError } from '../protocol/errors.js';
import { randomBytes } from '../server/file-tools/random.js';
import { decodeSegments } from '../server/route-table.js';

/** The capability the route of `pathname` needs, by its first segment as the router decodes it. */
export function routeCapability(pathname: string): Capability | undefined {
  return capabilityOfSegment(decodeSegments(pathname)[0]);
}

/** Parses `--capabilities shell,files`: every name must be a known capability. */
export function parseCapabilities(list: string): Capability[] {
  const names = list
    .split(',')
    .map((name) => name.trim())
    .filter((name) => name !== '');
  for (const name of names) {
    if (!(CAPABILITIES as readonly string[]).includes(name)) {
      throw new InvalidArgumentError(
        `unknown capability ${JSON.stringify(name)}: use ${CAPABILITIES.join(', ')}`,
      );
    }
  }
  return names as Capability[];
}

/**
 * The check envd runs on a request that presents the sandbox's client token: a route whose
 * capability the template lacks is a 403 CapabilityError naming the template and the capability.
 */
export function capabilityCheck(
  template: string,
  capabilities: readonly Capability[],
): (req: IncomingMessage) => void {
  return (req) => {
    const pathname = (req.url ?? '/').split('?', 1)[0] as string;
    const needed = routeCapability(pathname);
    if (needed && !capabilities.includes(needed)) {
      throw new CapabilityError(capabilityRefusal(template, needed, `${req.method} ${pathname}`));
    }
  };
}

/**
 * envd's tokens, from its token file: the first line is the sandbox's client token (what the
 * gateway presents for the sandbox's users, limited to the template's capabilities), the second
 * the control plane's (every route: builds, snapshots and home exports need files and processes
 * whatever the template allows). A file of one line has no control token: one nobody knows is
 * made up, so the client token stays limited.
 */
export function parseTokens(text: string): { client: string; control: string } | undefined {
  const [client, control] = text.split('\n').map((line) => line.trim());
  if (!client) return undefined;
  return { client, control: control || randomBytes(32).toString('base64url') };
}
