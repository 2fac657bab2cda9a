import type {
  V1IPBlock,
  V1NetworkPolicy,
  V1NetworkPolicyEgressRule,
  V1OwnerReference,
} from '@kubernetes/client-node';
import {
  ALWAYS_DENIED,
  type EgressPolicy,
  type Entry,
  type ParsedPolicy,
  parseEntry,
  parsePolicy,
} from '../../egress/policy.js';
import { MANAGED_BY, MANAGED_BY_LABEL, SANDBOX_ID_LABEL, SANDBOXES_LABEL } from './pod-spec.js';

/**
 * Where an internet sandbox's names resolve: the cluster's DNS, as kubeadm, kind, k3s, EKS, GKE
 * and AKS label it (CoreDNS keeps kube-dns's `k8s-app` label).
 */
export const CLUSTER_DNS = {
  namespace: 'kube-system',
  podLabels: { 'k8s-app': 'kube-dns' },
} as const;

/** The NetworkPolicy of sandbox `id` (the `internet` network). */
export function networkPolicyName(id: string): string {
  return `abx-${id}-egress`;
}

type Cidr = Entry & { kind: 'cidr' };
type Family = 'ipv4' | 'ipv6';

const cidr = (text: string, where: string) => parseEntry(text, where) as Cidr;
const familyOf = (entry: Cidr): Family => entry.range[0].kind() as Family;
const ALWAYS = ALWAYS_DENIED.map((range) => cidr(range.cidr, 'always denied'));
const EVERYWHERE: Record<Family, Cidr> = {
  ipv4: cidr('0.0.0.0/0', 'everywhere'),
  ipv6: cidr('::/0', 'everywhere'),
};

/** Whether CIDR `outer` holds all of `inner` (two CIDRs either nest or are disjoint). */
function contains(outer: Cidr, inner: Cidr): boolean {
  const [network, bits] = outer.range;
  const [address, innerBits] = inner.range;
  return (
    network.kind() === address.kind() &&
    bits <= innerBits &&
    address.match([network, bits] as never)
  );
}

/** What two CIDRs have in common: the smaller when they nest, nothing when disjoint. */
function common(a: Cidr, b: Cidr): Cidr | undefined {
  if (contains(a, b)) return b;
  if (contains(b, a)) return a;
  return undefined;
}

/**
 * `range` less `minus`, as one ipBlock: none when a range of `minus` holds it all, else the ranges
 * of `minus` inside it as `except` (each strictly inside `cidr`, as the API server requires; one
 * held by another is left out).
 */
function block(range: Cidr, minus: readonly Cidr[]): V1IPBlock | undefined {
  if (minus.some((m) => contains(m, range))) return undefined;
  const inside = minus.filter((m) => contains(range, m));
  const except = inside.filter(
    (m, i) => !inside.some((o, j) => j !== i && contains(o, m) && (o.text !== m.text || j < i)),
  );
  return { cidr: range.text, ...(except.length > 0 ? { except: except.map((e) => e.text) } : {}) };
}

/**
 * The address ranges a sandbox may reach under `policy`, as ipBlocks of one family: an allow
 * entry wins over a deny entry, what no entry names is allowed, the always-denied ranges stay
 * denied unless the operator `permit`s them, where the lists apply as anywhere else. Rules of a
 * NetworkPolicy add up, so each part is a block of its own:
 * - everything, less the always-denied ranges and the deny list (none when it denies all);
 * - each permitted part of an always-denied range, less the deny list;
 * - each allow entry, less the always-denied ranges, and its permitted parts of them whole.
 */
export function egressBlocks(policy: ParsedPolicy, permit: readonly Cidr[], family: Family) {
  const only = (entries: readonly Entry[]) =>
    entries.filter((e): e is Cidr => e.kind === 'cidr' && familyOf(e) === family);
  const always = only(ALWAYS);
  const permitted = only(permit);
  const deny = only(policy.deny);
  const permittedParts = (range: Cidr) =>
    always.flatMap((a) =>
      permitted.flatMap((p) => {
        const part = common(a, p);
        const inRange = part && common(part, range);
        return inRange ? [inRange] : [];
      }),
    );
  const blocks = [
    block(EVERYWHERE[family], [...always, ...deny]),
    ...permittedParts(EVERYWHERE[family]).map((part) => block(part, deny)),
    ...only(policy.allow).flatMap((allowed) => [
      block(allowed, always),
      ...permittedParts(allowed).map((part) => block(part, [])),
    ]),
  ];
  const seen = new Set<string>();
  return blocks.filter((b): b is V1IPBlock => {
    if (!b) return false;
    const key = JSON.stringify(b);
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/** The operator's permitted ranges (ABX_EGRESS_PERMIT), read; a non-CIDR is an error naming it. */
export function permittedRanges(permit: readonly string[]): Cidr[] {
  return permit.map((text, i) => {
    const entry = parseEntry(text, `ABX_EGRESS_PERMIT[${i}]`);
    if (entry.kind !== 'cidr') {
      throw new Error(`ABX_EGRESS_PERMIT takes CIDRs only; '${text}' is not one`);
    }
    return entry;
  });
}

/**
 * The domain entries of `policy` that a NetworkPolicy would have to enforce and cannot (it
 * matches addresses, never names): all of them, except an allowed name where the deny list names
 * no range (every public address is allowed anyway) and a denied name where the deny list denies
 * every address (what an allow entry opens passes anyway: allow wins).
 */
export function unenforceableEntries(policy: ParsedPolicy): string[] {
  const ranges = policy.deny.filter((e) => e.kind === 'cidr').map((e) => e.text);
  const deniesAll = ranges.includes('0.0.0.0/0') && ranges.includes('::/0');
  const names = (entries: Entry[]) => entries.filter((e) => e.kind !== 'cidr').map((e) => e.text);
  return [
    ...(ranges.length > 0 ? names(policy.allow).map((name) => `allowOut ${name}`) : []),
    ...(deniesAll ? [] : names(policy.deny).map((name) => `denyOut ${name}`)),
  ];
}

/** What a refusal of domain entries says to do (create and live change alike). */
export function domainsRefusal(entries: readonly string[]): string {
  return `the kubernetes provider enforces egress with a NetworkPolicy, which matches addresses, never names, so it cannot enforce ${entries.join(', ')}; rather than let them pass unchecked it refuses the policy: give their addresses as CIDRs, or run the sandbox on the local or docker provider, whose egress decides by name (docs/providers.md, "The internet network")`;
}

export interface NetworkPolicyContext {
  namespace: string;
  /** `sandboxesHash` of the daemon's sandboxes folder: the sweep's label (none: not known). */
  sandboxesHash?: string;
  /** The operator's permitted always-denied ranges. */
  permit: readonly Cidr[];
  /**
   * The objects that own it (the pod, and its Sandbox): the garbage collector removes it once
   * all of them are gone.
   */
  owners?: V1OwnerReference[];
}

/**
 * Sandbox `id`'s NetworkPolicy: it selects that pod alone (by its `abx.dev/sandbox-id` label) and
 * isolates its egress (`policyTypes: [Egress]`); what it allows is DNS (UDP and TCP 53) to the
 * cluster's DNS, and TCP to the address ranges of {@link egressBlocks}, IPv4 and IPv6. Nothing
 * else leaves: no UDP but DNS, no ICMP, as on the local provider.
 */
export function egressNetworkPolicy(
  id: string,
  policy: EgressPolicy,
  context: NetworkPolicyContext,
): V1NetworkPolicy {
  const parsed = parsePolicy(policy);
  const blocks = [
    ...egressBlocks(parsed, context.permit, 'ipv4'),
    ...egressBlocks(parsed, context.permit, 'ipv6'),
  ];
  const egress: V1NetworkPolicyEgressRule[] = [
    {
      to: [
        {
          namespaceSelector: {
            matchLabels: { 'kubernetes.io/metadata.name': CLUSTER_DNS.namespace },
          },
          podSelector: { matchLabels: { ...CLUSTER_DNS.podLabels } },
        },
      ],
      ports: [
        { protocol: 'UDP', port: 53 },
        { protocol: 'TCP', port: 53 },
      ],
    },
    ...(blocks.length > 0
      ? [{ to: blocks.map((ipBlock) => ({ ipBlock })), ports: [{ protocol: 'TCP' }] }]
      : []),
  ];
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: {
      name: networkPolicyName(id),
      namespace: context.namespace,
      labels: {
        [MANAGED_BY_LABEL]: MANAGED_BY,
        [SANDBOX_ID_LABEL]: id,
        ...(context.sandboxesHash ? { [SANDBOXES_LABEL]: context.sandboxesHash } : {}),
      },
      ...(context.owners?.length ? { ownerReferences: context.owners.map((o) => ({ ...o })) } : {}),
    },
    spec: {
      podSelector: { matchLabels: { [SANDBOX_ID_LABEL]: id } },
      policyTypes: ['Egress'],
      egress,
    },
  };
}
