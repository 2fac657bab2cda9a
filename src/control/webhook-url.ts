import { lookup } from 'node:dns/promises';
import ipaddr from 'ipaddr.js';
import { interfaceAddresses } from '../egress/host-addresses.js';
import { EgressRules } from '../egress/policy.js';
import { InvalidArgumentError } from '../errors.js';

/**
 * Webhook URLs are egress from the daemon: a URL may not reach the always-denied ranges
 * (loopback, private, link-local and cloud metadata, ...: egress/policy.ts ALWAYS_DENIED) nor an
 * address of this host, unless the operator permits them: `ABX_WEBHOOK_PERMIT` (CIDRs, comma
 * separated, e.g. `127.0.0.0/8` for a receiver on loopback) or `ABX_WEBHOOK_ALLOW_PRIVATE=1`
 * (every range). Checked at register and update (400), and again at each delivery after the
 * name is resolved; the delivery connects to the address that was checked, so a name that
 * changes its answer in between (DNS rebinding) cannot slip through.
 */

/** A name's lookup at register or delivery must answer within this. */
export const WEBHOOK_DNS_TIMEOUT_MS = 5_000;
/** The longest URL a webhook takes. */
export const WEBHOOK_URL_MAX = 2048;

/** The rules of webhook egress, from the environment. */
export function webhookRules(env: NodeJS.ProcessEnv = process.env): EgressRules {
  const permit =
    env.ABX_WEBHOOK_ALLOW_PRIVATE === '1'
      ? ['0.0.0.0/0', '::/0']
      : (env.ABX_WEBHOOK_PERMIT ?? '')
          .split(',')
          .map((c) => c.trim())
          .filter(Boolean);
  try {
    return new EgressRules({
      permit,
      hostAddresses: () => new Set(interfaceAddresses()),
    });
  } catch (error) {
    throw new Error(
      `ABX_WEBHOOK_PERMIT must be CIDRs separated by commas (${(error as Error).message})`,
    );
  }
}

/** A webhook URL as given: http or https, at most {@link WEBHOOK_URL_MAX} characters. */
export function parseWebhookUrl(value: unknown, where: string): URL {
  if (typeof value !== 'string' || value === '') {
    throw new InvalidArgumentError(`${where} must be the receiver's URL (http:// or https://)`);
  }
  if (value.length > WEBHOOK_URL_MAX) {
    throw new InvalidArgumentError(
      `${where} is ${value.length} characters; at most ${WEBHOOK_URL_MAX}`,
    );
  }
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new InvalidArgumentError(`${where} is not a URL: ${JSON.stringify(value.slice(0, 200))}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new InvalidArgumentError(
      `${where} must be http:// or https://, not ${url.protocol.replace(/:$/, '')}://`,
    );
  }
  return url;
}

/** The URL's host as a bare name or address (IPv6 without brackets). */
function hostOf(url: URL): string {
  return url.hostname.replace(/^\[(.*)\]$/, '$1');
}

async function resolveAll(host: string): Promise<string[]> {
  if (ipaddr.isValid(host)) return [ipaddr.parse(host).toString()];
  let timer: NodeJS.Timeout | undefined;
  try {
    const answers = await Promise.race([
      lookup(host, { all: true, verbatim: true }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no DNS answer for ${host} within ${WEBHOOK_DNS_TIMEOUT_MS} ms`)),
          WEBHOOK_DNS_TIMEOUT_MS,
        );
      }),
    ]);
    return answers.map((a) => a.address);
  } finally {
    clearTimeout(timer);
  }
}

const PERMIT_HINT =
  'the daemon refuses webhooks to loopback, private, link-local and metadata addresses; its operator may permit a range with ABX_WEBHOOK_PERMIT=CIDR[,CIDR] (or all with ABX_WEBHOOK_ALLOW_PRIVATE=1)';

/**
 * Refuses (400) a URL whose host is, or resolves to, an address the rules deny. A name that does
 * not resolve now is taken: it is checked again at each delivery.
 */
export async function checkWebhookUrl(url: URL, rules: EgressRules, where: string): Promise<void> {
  const host = hostOf(url);
  const addresses = await resolveAll(host).catch(() => []);
  for (const address of addresses) {
    const rule = rules.alwaysDenied(address);
    if (rule) {
      throw new InvalidArgumentError(
        `${where} ${url.origin} reaches ${address}, which is ${rule.replace(/^always denied: /, '')}: ${PERMIT_HINT}; nothing was changed`,
        { code: 'webhook_url_refused' },
      );
    }
  }
}

/**
 * The address a delivery connects to: the first address of the URL's host the rules permit.
 * Throws an Error naming the rule when every address is denied, or the name does not resolve.
 */
export async function deliveryAddress(
  url: URL,
  rules: EgressRules,
): Promise<{ address: string; family: 4 | 6 }> {
  const addresses = await resolveAll(hostOf(url));
  if (addresses.length === 0) throw new Error(`${hostOf(url)} has no address`);
  let refused = '';
  for (const address of addresses) {
    const rule = rules.alwaysDenied(address);
    if (rule) {
      refused ||= `${address}: ${rule}`;
      continue;
    }
    return { address, family: ipaddr.parse(address).kind() === 'ipv4' ? 4 : 6 };
  }
  throw new Error(`refused: ${refused} (${PERMIT_HINT})`);
}
