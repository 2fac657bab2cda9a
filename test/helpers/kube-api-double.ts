import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import {
  createServer,
  type IncomingMessage,
  request,
  type Server,
  type ServerResponse,
} from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import ipaddr from 'ipaddr.js';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { PersistentVolumeClaim } from 'kubernetes-models/v1/PersistentVolumeClaim';
import { Pod } from 'kubernetes-models/v1/Pod';
import { Secret } from 'kubernetes-models/v1/Secret';

// An in-test Kubernetes API server: the real REST paths and JSON for the objects the provider
// uses (pods, secrets, events, networking.k8s.io/v1 NetworkPolicies; the agent-sandbox CRDs when
// `crds` is set), list with label and field selectors, create, get, replace (PUT, NetworkPolicies
// only: 409 when the resourceVersion sent is not the stored one), delete with grace and uid
// preconditions, watch (`?watch=true`, newline-delimited events after a resourceVersion; 410 Gone
// before the oldest kept), Status objects for 404/409/422, discovery. Every object created or
// replaced is validated first: pods, secrets and NetworkPolicies with kubernetes-models (generated
// from Kubernetes' OpenAPI) and the rules the API server adds (an ipBlock's `except` strictly
// inside its `cidr`...), custom resources with the schemas the test gives; an invalid one is
// refused with 422, as a real API server would. A test may make it refuse any request
// (`refuse`), as an admission webhook or RBAC would.
//
// Its "kubelet" makes pods real on this host: the init containers' and the main container's
// commands run for real, each in its own mount, pid and uts namespaces (unshare), as the uid of
// the pod's securityContext (setpriv, no capabilities, no new privileges), with the pod's volumes
// as host folders bound at their mount paths, on the host's file system and network otherwise.
// Each pod gets an address of its own in 127.0.0.0/8. This is not a container runtime: images are
// not pulled (the host's system stands for every image; the runtime image is a folder given by
// the test), and nothing but what the pod asks is mounted. It can be told to leave a pod Pending
// (Unschedulable, ErrImagePull, or held until the test lets it start) and to crash one. Pods run
// on the host's network: no NetworkPolicy is enforced (no CNI), so tests of them read the objects
// the provider made, not traffic.
//
// Its "provisioner" gives PersistentVolumeClaims storage by StorageClass (`storageClasses`, no
// StorageClass objects served): a tmpfs of the claim's size (a block volume: writes past it fail
// with ENOSPC) or a plain folder (a share that bounds nothing), bound at once or at the first pod
// (WaitForFirstConsumer), or refused with the events a real provisioner writes (an unknown class,
// an access mode the class lacks, no class and no default one). A claim outlives its pods; one in
// use is deleted once no pod uses it (pvc-protection). The kubelet mounts claims with subPath,
// readOnly and the pod's fsGroup (the claim's root made the group's, setgid, as the kubelet does
// for block volumes). With `metricsApi` it serves metrics.k8s.io/v1beta1 PodMetrics measured from
// the pods' processes (/proc: CPU time between two reads, resident memory).

// biome-ignore lint/suspicious/noExplicitAny: Kubernetes objects as JSON, read field by field
type Obj = Record<string, any>;

export interface KubeApiDoubleOptions {
  /** Scratch folder: pods' volumes and logs. */
  dir: string;
  /** The folder the runtime image has at /opt/abx (a portable runtime). */
  runtimeImageDir: string;
  /** Serve the agent-sandbox API groups (discovery and their resources). */
  crds?: boolean;
  /** Validators of custom resources by `group/version/resource`: return problems, none if valid. */
  validators?: Record<string, (object: Obj) => string[]>;
  /** StorageClasses by name (default {@link STORAGE_CLASSES}). */
  storageClasses?: Record<string, StorageClassDouble>;
  /** The class of claims that name none (default `standard`; null: the cluster has none). */
  defaultStorageClass?: string | null;
  /** Serve metrics.k8s.io/v1beta1 (metrics-server) pod metrics. */
  metricsApi?: boolean;
}

/** A StorageClass as the double's provisioner gives it. */
export interface StorageClassDouble {
  binding: 'Immediate' | 'WaitForFirstConsumer';
  accessModes: string[];
  /** A tmpfs of the claim's size (`block`), or a folder of the host's file system (`share`). */
  storage: 'block' | 'share';
}

/** The double's StorageClasses unless a test gives its own. */
export const STORAGE_CLASSES: Record<string, StorageClassDouble> = {
  standard: {
    binding: 'Immediate',
    accessModes: ['ReadWriteOnce', 'ReadWriteMany'],
    storage: 'block',
  },
  'local-wffc': {
    binding: 'WaitForFirstConsumer',
    accessModes: ['ReadWriteOnce', 'ReadWriteMany'],
    storage: 'block',
  },
  'block-rwo': { binding: 'Immediate', accessModes: ['ReadWriteOnce'], storage: 'block' },
  'nfs-share': {
    binding: 'Immediate',
    accessModes: ['ReadWriteOnce', 'ReadWriteMany'],
    storage: 'share',
  },
};

/** A request as `refuse` sees it. */
export interface DoubleRequest {
  method: string;
  resource: string;
  namespace: string;
  name?: string;
  /** The body of a create or replace. */
  object?: Obj;
}

/** What the kubelet does with a new pod (tests set it; default: run it). */
export type PodFate =
  | { kind: 'run' }
  /** Left Pending with no condition (not scheduled yet) until `until` resolves, then run. */
  | { kind: 'hold'; until: Promise<void> }
  | { kind: 'unschedulable'; message?: string }
  | { kind: 'image-pull-error'; message?: string };

interface Stored {
  resource: string;
  namespace: string;
  object: Obj;
}

interface WatchEvent {
  rv: number;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  key: string;
  resource: string;
  namespace: string;
  object: Obj;
}

interface Running {
  child: ChildProcess;
  exited: Promise<number | null>;
}

const CORE_RESOURCES: Record<string, string> = {
  pods: 'Pod',
  secrets: 'Secret',
  events: 'Event',
  persistentvolumeclaims: 'PersistentVolumeClaim',
};
const METRICS_GROUP = 'metrics.k8s.io';
const CLK_TCK = 100;
/** Where a pod's container sees the host folders its mounts come from, before it mounts them. */
const STAGE = '/srv';
const CRD_GROUPS: Record<string, Record<string, string>> = {
  'agents.x-k8s.io': { sandboxes: 'Sandbox' },
  'extensions.agents.x-k8s.io': {
    sandboxclaims: 'SandboxClaim',
    sandboxtemplates: 'SandboxTemplate',
    sandboxwarmpools: 'SandboxWarmPool',
  },
};
/** Built-in API groups beyond the core one: group → version → resource → kind. */
const BUILTIN_GROUPS: Record<string, Record<string, Record<string, string>>> = {
  'networking.k8s.io': { v1: { networkpolicies: 'NetworkPolicy' } },
};
/** Resources the double replaces with PUT (others answer 405: it does not model their updates). */
const REPLACEABLE = new Set(['networkpolicies']);
const CRD_VERSION = 'v1beta1';
const NODE = 'double-node';
const ENVD_READY_PATH = '/health';

const quote = (value: string) => `'${value.replace(/'/g, `'\\''`)}'`;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function status(code: number, reason: string, message: string, details?: Obj): Obj {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    ...(details ? { details } : {}),
    code,
  };
}

/** `a=b,c!=d,e` against labels. */
function matchesLabels(selector: string | null, labels: Record<string, string> = {}): boolean {
  if (!selector) return true;
  return selector.split(',').every((term) => {
    const ne = /^([^!=]+)!=(.*)$/.exec(term);
    if (ne) return labels[ne[1] as string] !== ne[2];
    const eq = /^([^!=]+)==?(.*)$/.exec(term);
    if (eq) return labels[eq[1] as string] === eq[2];
    if (term.startsWith('!')) return !(term.slice(1) in labels);
    return term in labels;
  });
}

/** `metadata.name=x,involvedObject.kind=Pod` against an object. */
function matchesFields(selector: string | null, object: Obj): boolean {
  if (!selector) return true;
  return selector.split(',').every((term) => {
    const [path, value] = term.split(/==?/) as [string, string];
    const actual = path.split('.').reduce<Obj | undefined>((at, key) => at?.[key], object);
    return String(actual ?? '') === value;
  });
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function freeAddress(taken: Set<string>): string {
  for (;;) {
    const address = `127.${10 + Math.floor(Math.random() * 200)}.${Math.floor(Math.random() * 250)}.${2 + Math.floor(Math.random() * 250)}`;
    if (!taken.has(address)) return address;
  }
}

export class KubeApiDouble {
  readonly requests: { method: string; path: string }[] = [];
  /** Objects the double no longer has, as `resource namespace/name`, in the order they went. */
  readonly deleted: string[] = [];
  /** Objects refused as invalid, with why (a test that sees any fails). */
  readonly invalid: { path: string; problems: string }[] = [];
  private server: Server | undefined;
  private url = '';
  private rv = 1;
  private readonly store = new Map<string, Stored>();
  private readonly history: WatchEvent[] = [];
  private readonly watchers = new Set<{
    resource: string;
    namespace: string | undefined;
    labels: string | null;
    fields: string | null;
    res: ServerResponse;
  }>();
  private readonly processes = new Map<string, Running[]>();
  private readonly addresses = new Set<string>();
  private readonly stopping = new Set<string>();
  /** Set by close(): no container starts after it. */
  private closing = false;
  /** The tmpfs of each bound claim of a `block` class (by claim uid), unmounted when it goes. */
  private readonly mounted = new Set<string>();
  /** The previous CPU reading of each pod (by uid), for metrics.k8s.io's rates. */
  private readonly cpuReadings = new Map<string, { at: number; ticks: number }>();
  /** Permissions SelfSubjectAccessReviews deny, as `verb resource`. */
  readonly denied = new Set<string>();
  /**
   * Whether the SandboxClaim controller binds claims (false: a controller that is down, so claims
   * stay unbound).
   */
  bindClaims = true;
  /** Decides each new pod's fate (by default, every pod runs). */
  fate: (pod: Obj) => PodFate = () => ({ kind: 'run' });
  /**
   * Refuses a request before anything is stored, as an admission webhook or RBAC would: the
   * Status to answer with (code, reason, message), or undefined to serve it (the default).
   */
  refuse: (
    request: DoubleRequest,
  ) => { code: number; reason: string; message: string } | undefined = () => undefined;

  constructor(private readonly options: KubeApiDoubleOptions) {}

  async start(): Promise<string> {
    mkdirSync(this.options.dir, { recursive: true });
    this.server = createServer((req, res) => {
      this.handle(req, res).catch((error: Error) => {
        if (!res.headersSent) this.send(res, 500, status(500, 'InternalError', error.message));
        else res.destroy();
      });
    });
    await new Promise<void>((resolve) => this.server?.listen(0, '127.0.0.1', resolve));
    const address = this.server.address() as { port: number };
    this.url = `http://127.0.0.1:${address.port}`;
    return this.url;
  }

  /** A client configuration pointing at this server, as a kubeconfig would. */
  kubeConfig(namespace = 'sandboxes'): KubeConfig {
    const config = new KubeConfig();
    config.loadFromOptions({
      clusters: [{ name: 'double', server: this.url, skipTLSVerify: true }],
      users: [{ name: 'tester', token: 'double-token' }],
      contexts: [{ name: 'double', cluster: 'double', user: 'tester', namespace }],
      currentContext: 'double',
    });
    return config;
  }

  /** Objects of `resource` still stored, as `resource namespace/name`. */
  objects(resource?: string): string[] {
    return [...this.store.values()]
      .filter((s) => !resource || s.resource === resource)
      .map((s) => `${s.resource} ${s.namespace}/${s.object.metadata.name}`);
  }

  get(resource: string, namespace: string, name: string): Obj | undefined {
    return this.store.get(`${resource}/${namespace}/${name}`)?.object;
  }

  /** Pids of the pods' processes still running (init containers and main containers). */
  livePids(podName?: string): number[] {
    const pids: number[] = [];
    for (const [key, running] of this.processes) {
      if (podName && !key.endsWith(`/${podName}`)) continue;
      for (const { child } of running) {
        if (child.exitCode === null && child.signalCode === null && child.pid) pids.push(child.pid);
      }
    }
    return pids;
  }

  /** Kills a pod's main container, as a node failure would: the pod fails. */
  crash(namespace: string, name: string): void {
    for (const { child } of this.processes.get(`pods/${namespace}/${name}`) ?? []) killPod(child);
  }

  /** Creates an object as a user with kubectl would (labelled pods the provider did not make). */
  async put(resource: string, namespace: string, object: Obj): Promise<Obj> {
    const answer = await fetch(`${this.url}${this.collectionPath(resource, namespace)}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer double-token' },
      body: JSON.stringify(object),
    });
    const created = (await answer.json()) as Obj;
    if (answer.status !== 201)
      throw new Error(`the double refused ${resource}: ${created.message}`);
    return created;
  }

  async close(): Promise<void> {
    // A kubelet still starting a pod stops before its next container: nothing starts after this.
    this.closing = true;
    for (const watcher of this.watchers) watcher.res.destroy();
    this.watchers.clear();
    for (const key of [...this.processes.keys()]) await this.stopProcesses(key);
    for (const dir of this.mounted) unmount(dir);
    this.mounted.clear();
    await new Promise<void>((resolve) => {
      if (!this.server) return resolve();
      this.server.closeAllConnections();
      this.server.close(() => resolve());
    });
  }

  private collectionPath(resource: string, namespace: string): string {
    for (const [group, resources] of Object.entries(CRD_GROUPS)) {
      if (resource in resources)
        return `/apis/${group}/${CRD_VERSION}/namespaces/${namespace}/${resource}`;
    }
    for (const [group, versions] of Object.entries(BUILTIN_GROUPS)) {
      for (const [version, resources] of Object.entries(versions)) {
        if (resource in resources)
          return `/apis/${group}/${version}/namespaces/${namespace}/${resource}`;
      }
    }
    return `/api/v1/namespaces/${namespace}/${resource}`;
  }

  private send(res: ServerResponse, code: number, body: Obj): void {
    const text = JSON.stringify(body);
    res.writeHead(code, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(text),
    });
    res.end(text);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://double');
    const method = req.method ?? 'GET';
    this.requests.push({ method, path: `${url.pathname}${url.search}` });
    if (req.headers.authorization !== 'Bearer double-token') {
      return this.send(res, 401, status(401, 'Unauthorized', 'Unauthorized'));
    }
    const path = url.pathname.replace(/\/$/, '');
    if (path === '/api')
      return this.send(res, 200, {
        kind: 'APIVersions',
        versions: ['v1'],
        serverAddressByClientCIDRs: [],
      });
    if (path === '/apis') return this.send(res, 200, this.groupList());
    if (path === '/version') {
      return this.send(res, 200, { major: '1', minor: '31', gitVersion: 'v1.31.0-double' });
    }
    const groupDiscovery = /^\/apis\/([^/]+)\/([^/]+)$/.exec(path);
    if (groupDiscovery)
      return this.sendResourceList(res, groupDiscovery[1] as string, groupDiscovery[2] as string);
    if (path === '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews' && method === 'POST') {
      const review = JSON.parse(await readBody(req)) as Obj;
      const attributes = review.spec?.resourceAttributes ?? {};
      const allowed = !this.denied.has(`${attributes.verb} ${attributes.resource}`);
      return this.send(res, 201, { ...review, status: { allowed } });
    }
    const metrics =
      /^\/apis\/metrics\.k8s\.io\/v1beta1\/namespaces\/([^/]+)\/pods(?:\/([^/]+))?$/.exec(path);
    if (metrics && this.options.metricsApi && method === 'GET') {
      const [, ns, podName] = metrics as unknown as [string, string, string | undefined];
      const labels = url.searchParams.get('labelSelector');
      const items = [...this.store.values()]
        .filter((s) => s.resource === 'pods' && s.namespace === ns)
        .filter((s) => !podName || s.object.metadata.name === podName)
        .filter((s) => matchesLabels(labels, s.object.metadata.labels))
        .flatMap((s) => this.podMetrics(s.object) ?? []);
      if (podName) {
        const [one] = items;
        if (!one)
          return this.send(res, 404, status(404, 'NotFound', `podmetrics "${podName}" not found`));
        return this.send(res, 200, one);
      }
      return this.send(res, 200, {
        kind: 'PodMetricsList',
        apiVersion: `${METRICS_GROUP}/v1beta1`,
        metadata: {},
        items,
      });
    }
    const core = /^\/api\/v1\/namespaces\/([^/]+)\/([^/]+)(?:\/([^/]+))?$/.exec(path);
    const custom = /^\/apis\/([^/]+)\/([^/]+)\/namespaces\/([^/]+)\/([^/]+)(?:\/([^/]+))?$/.exec(
      path,
    );
    let namespace: string;
    let resource: string;
    let name: string | undefined;
    let kind: string | undefined;
    let apiVersion: string;
    if (core) {
      [, namespace, resource, name] = core as unknown as [
        string,
        string,
        string,
        string | undefined,
      ];
      kind = CORE_RESOURCES[resource];
      apiVersion = 'v1';
    } else if (custom && BUILTIN_GROUPS[custom[1] as string]?.[custom[2] as string]) {
      const [group, version] = [custom[1] as string, custom[2] as string];
      [namespace, resource, name] = [custom[3] as string, custom[4] as string, custom[5]];
      kind = BUILTIN_GROUPS[group]?.[version]?.[resource];
      apiVersion = `${group}/${version}`;
    } else if (custom && this.options.crds && custom[2] === CRD_VERSION) {
      const group = custom[1] as string;
      [namespace, resource, name] = [custom[3] as string, custom[4] as string, custom[5]];
      kind = CRD_GROUPS[group]?.[resource];
      apiVersion = `${group}/${CRD_VERSION}`;
    } else {
      return this.send(
        res,
        404,
        status(
          404,
          'NotFound',
          `the server could not find the requested resource (${method} ${path})`,
        ),
      );
    }
    if (!kind)
      return this.send(
        res,
        404,
        status(404, 'NotFound', `the server doesn't have a resource type "${resource}"`),
      );
    const key = (n: string) => `${resource}/${namespace}/${n}`;
    // The body of a create or replace, read once (for `refuse` and the handlers below).
    const body =
      method === 'POST' || method === 'PUT' ? (JSON.parse(await readBody(req)) as Obj) : undefined;
    const refused = this.refuse({
      method,
      resource,
      namespace,
      ...(name ? { name } : {}),
      ...(body ? { object: body } : {}),
    });
    if (refused) {
      return this.send(res, refused.code, status(refused.code, refused.reason, refused.message));
    }

    if (!name && method === 'GET') {
      const labels = url.searchParams.get('labelSelector');
      const fields = url.searchParams.get('fieldSelector');
      if (url.searchParams.get('watch') === 'true') {
        return this.watch(
          res,
          resource,
          namespace,
          labels,
          fields,
          url.searchParams.get('resourceVersion'),
        );
      }
      const items = [...this.store.values()]
        .filter((s) => s.resource === resource && s.namespace === namespace)
        .map((s) => s.object)
        .filter((o) => matchesLabels(labels, o.metadata.labels) && matchesFields(fields, o));
      return this.send(res, 200, {
        kind: `${kind}List`,
        apiVersion,
        metadata: { resourceVersion: String(this.rv) },
        items,
      });
    }
    if (!name && method === 'POST') {
      const object = body as Obj;
      const problems = this.validate(apiVersion, resource, kind, object);
      if (problems) {
        this.invalid.push({ path, problems });
        return this.send(
          res,
          422,
          status(422, 'Invalid', `${kind} "${object?.metadata?.name}" is invalid: ${problems}`, {
            name: object?.metadata?.name,
            kind,
          }),
        );
      }
      if (object.metadata.namespace && object.metadata.namespace !== namespace) {
        return this.send(
          res,
          400,
          status(
            400,
            'BadRequest',
            'the namespace of the provided object does not match the namespace sent on the request',
          ),
        );
      }
      if (this.store.has(key(object.metadata.name))) {
        return this.send(
          res,
          409,
          status(409, 'AlreadyExists', `${resource} "${object.metadata.name}" already exists`, {
            name: object.metadata.name,
            kind: resource,
          }),
        );
      }
      object.metadata = {
        ...object.metadata,
        namespace,
        uid: randomUUID(),
        creationTimestamp: new Date().toISOString(),
        generation: 1,
      };
      if (resource === 'pods') object.status = { phase: 'Pending', qosClass: 'Burstable' };
      if (resource === 'persistentvolumeclaims') object.status = { phase: 'Pending' };
      this.write(resource, namespace, object, 'ADDED');
      this.send(res, 201, object);
      if (resource === 'persistentvolumeclaims') this.provision(namespace, object.metadata.name);
      if (resource === 'pods') void this.kubelet(namespace, object.metadata.name as string);
      if (resource === 'sandboxes') this.sandboxController(namespace, object);
      if (resource === 'sandboxwarmpools' || resource === 'sandboxtemplates') {
        this.reconcilePools(namespace);
      }
      if (resource === 'sandboxclaims') this.claimController(namespace, object.metadata.name);
      return;
    }
    if (!name)
      return this.send(
        res,
        405,
        status(405, 'MethodNotAllowed', `${method} is not supported on ${path}`),
      );
    const stored = this.store.get(key(name));
    if (method === 'GET') {
      if (!stored)
        return this.send(
          res,
          404,
          status(404, 'NotFound', `${resource} "${name}" not found`, { name, kind: resource }),
        );
      return this.send(res, 200, stored.object);
    }
    if (method === 'PUT') {
      if (!REPLACEABLE.has(resource)) {
        return this.send(
          res,
          405,
          status(405, 'MethodNotAllowed', `the double does not replace ${resource}`),
        );
      }
      const object = body as Obj;
      if (object?.metadata?.name !== name) {
        return this.send(
          res,
          400,
          status(
            400,
            'BadRequest',
            `the name of the object (${object?.metadata?.name}) does not match the name on the URL (${name})`,
          ),
        );
      }
      if (!stored) {
        return this.send(
          res,
          404,
          status(404, 'NotFound', `${resource}.${apiVersion.split('/')[0]} "${name}" not found`, {
            name,
            kind: resource,
          }),
        );
      }
      const sent = object.metadata.resourceVersion;
      if (sent !== undefined && sent !== stored.object.metadata.resourceVersion) {
        return this.send(
          res,
          409,
          status(
            409,
            'Conflict',
            `Operation cannot be fulfilled on ${resource}.${apiVersion.split('/')[0]} "${name}": the object has been modified; please apply your changes to the latest version and try again`,
          ),
        );
      }
      const problems = this.validate(apiVersion, resource, kind, object);
      if (problems) {
        this.invalid.push({ path, problems });
        return this.send(
          res,
          422,
          status(422, 'Invalid', `${kind} "${name}" is invalid: ${problems}`),
        );
      }
      const before = stored.object;
      object.metadata = {
        ...object.metadata,
        namespace,
        uid: before.metadata.uid,
        creationTimestamp: before.metadata.creationTimestamp,
        generation:
          JSON.stringify(object.spec) === JSON.stringify(before.spec)
            ? before.metadata.generation
            : (before.metadata.generation ?? 1) + 1,
      };
      this.write(resource, namespace, object, 'MODIFIED');
      return this.send(res, 200, object);
    }
    if (method === 'PATCH') {
      if (!stored) {
        return this.send(
          res,
          404,
          status(404, 'NotFound', `${resource} "${name}" not found`, { name, kind: resource }),
        );
      }
      if (!req.headers['content-type']?.startsWith('application/json-patch+json')) {
        return this.send(
          res,
          415,
          status(415, 'UnsupportedMediaType', 'the double takes JSON patches only'),
        );
      }
      const patched = structuredClone(stored.object);
      for (const op of JSON.parse(await readBody(req)) as Obj[]) {
        const keys = (op.path as string).split('/').slice(1);
        const last = keys.pop() as string;
        const parent = keys.reduce<Obj | undefined>((at, key) => at?.[key], patched);
        if (!parent || !['add', 'replace', 'remove'].includes(op.op)) {
          return this.send(
            res,
            422,
            status(422, 'Invalid', `the double cannot apply ${op.op} ${op.path}`),
          );
        }
        if (op.op === 'remove') {
          // RFC 6902: removing what is not there fails the whole patch.
          if (!(last in parent)) {
            return this.send(
              res,
              422,
              status(
                422,
                'Invalid',
                `the server rejected our request: remove ${op.path}: not found`,
              ),
            );
          }
          delete parent[last];
        } else parent[last] = op.value;
      }
      const problems = this.validate(patched.apiVersion, resource, kind, patched);
      if (problems) {
        this.invalid.push({ path, problems });
        return this.send(
          res,
          422,
          status(422, 'Invalid', `${kind} "${name}" is invalid: ${problems}`),
        );
      }
      this.write(resource, namespace, patched, 'MODIFIED');
      if (resource === 'sandboxclaims')
        this.scheduleClaimShutdown(namespace, name, patched.metadata.uid);
      if (resource === 'sandboxes') this.reconcileSandbox(namespace, name);
      return this.send(res, 200, patched);
    }
    if (method === 'DELETE') {
      const text = await readBody(req);
      const options = (text ? JSON.parse(text) : {}) as Obj;
      if (!stored)
        return this.send(
          res,
          404,
          status(404, 'NotFound', `${resource} "${name}" not found`, { name, kind: resource }),
        );
      const uid = options.preconditions?.uid;
      if (uid && uid !== stored.object.metadata.uid) {
        return this.send(
          res,
          409,
          status(
            409,
            'Conflict',
            `Operation cannot be fulfilled on ${resource} "${name}": Precondition failed: UID in precondition: ${uid}, UID in object meta: ${stored.object.metadata.uid}`,
          ),
        );
      }
      const graceText = url.searchParams.get('gracePeriodSeconds') ?? options.gracePeriodSeconds;
      const grace = graceText === undefined || graceText === null ? 30 : Number(graceText);
      if (resource === 'pods' && grace > 0) {
        if (!stored.object.metadata.deletionTimestamp) {
          stored.object.metadata.deletionTimestamp = new Date(
            Date.now() + grace * 1000,
          ).toISOString();
          stored.object.metadata.deletionGracePeriodSeconds = grace;
          this.write(resource, namespace, stored.object, 'MODIFIED');
          void this.terminate(namespace, name, stored.object.metadata.uid as string);
        }
        return this.send(res, 200, stored.object);
      }
      if (resource === 'persistentvolumeclaims' && this.claimUsers(namespace, name).length > 0) {
        // pvc-protection: a claim a pod uses goes once no pod does.
        if (!stored.object.metadata.deletionTimestamp) {
          stored.object.metadata.deletionTimestamp = new Date().toISOString();
          stored.object.metadata.finalizers = ['kubernetes.io/pvc-protection'];
          this.write(resource, namespace, stored.object, 'MODIFIED');
        }
        return this.send(res, 200, stored.object);
      }
      this.remove(resource, namespace, name);
      if (resource === 'pods') void this.stopProcesses(`pods/${namespace}/${name}`);
      return this.send(
        res,
        200,
        status(200, '', '', { name, kind: resource, uid: stored.object.metadata.uid }),
      );
    }
    return this.send(
      res,
      405,
      status(405, 'MethodNotAllowed', `${method} is not supported on ${path}`),
    );
  }

  private groupList(): Obj {
    const group = (name: string, version: string) => ({
      name,
      versions: [{ groupVersion: `${name}/${version}`, version }],
      preferredVersion: { groupVersion: `${name}/${version}`, version },
    });
    const groups = [
      ...Object.entries(BUILTIN_GROUPS).map(([name, versions]) =>
        group(name, Object.keys(versions)[0] as string),
      ),
      ...(this.options.crds ? Object.keys(CRD_GROUPS).map((name) => group(name, CRD_VERSION)) : []),
      ...(this.options.metricsApi ? [group(METRICS_GROUP, 'v1beta1')] : []),
    ];
    return { kind: 'APIGroupList', apiVersion: 'v1', groups };
  }

  private sendResourceList(res: ServerResponse, group: string, version: string): void {
    const resources =
      BUILTIN_GROUPS[group]?.[version] ??
      (this.options.crds && version === CRD_VERSION ? CRD_GROUPS[group] : undefined);
    if (!resources) {
      this.send(
        res,
        404,
        status(
          404,
          'NotFound',
          `the server could not find the requested resource (${group}/${version})`,
        ),
      );
      return;
    }
    this.send(res, 200, {
      kind: 'APIResourceList',
      apiVersion: 'v1',
      groupVersion: `${group}/${version}`,
      resources: Object.entries(resources).map(([name, kind]) => ({
        name,
        singularName: kind.toLowerCase(),
        namespaced: true,
        kind,
        verbs: ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'],
      })),
    });
  }

  private validate(
    apiVersion: string,
    resource: string,
    kind: string,
    object: Obj,
  ): string | undefined {
    if (object?.apiVersion !== apiVersion || object?.kind !== kind) {
      return `apiVersion/kind must be ${apiVersion} ${kind}, not ${object?.apiVersion} ${object?.kind}`;
    }
    if (
      typeof object.metadata?.name !== 'string' ||
      !/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(object.metadata.name)
    ) {
      return `metadata.name: Invalid value: ${JSON.stringify(object.metadata?.name)}`;
    }
    try {
      if (resource === 'pods') new Pod(object as ConstructorParameters<typeof Pod>[0]).validate();
      else if (resource === 'secrets')
        new Secret(object as ConstructorParameters<typeof Secret>[0]).validate();
      else if (resource === 'networkpolicies')
        new NetworkPolicy(object as ConstructorParameters<typeof NetworkPolicy>[0]).validate();
      else if (resource === 'persistentvolumeclaims')
        new PersistentVolumeClaim(
          object as ConstructorParameters<typeof PersistentVolumeClaim>[0],
        ).validate();
      else {
        const check = this.options.validators?.[`${apiVersion}/${resource}`];
        if (!check)
          return `no schema to validate ${apiVersion} ${resource} against: the test must give one`;
        const problems = check(object);
        if (problems.length > 0) return problems.join('; ');
      }
    } catch (error) {
      return (error as Error).message;
    }
    if (resource === 'pods') return podRules(object);
    if (resource === 'networkpolicies') return networkPolicyRules(object);
    return undefined;
  }

  private write(resource: string, namespace: string, object: Obj, type: WatchEvent['type']): void {
    const key = `${resource}/${namespace}/${object.metadata.name}`;
    this.rv++;
    object.metadata.resourceVersion = String(this.rv);
    if (type === 'DELETED') {
      this.store.delete(key);
      this.deleted.push(`${resource} ${namespace}/${object.metadata.name}`);
    } else this.store.set(key, { resource, namespace, object });
    const event: WatchEvent = {
      rv: this.rv,
      type,
      key,
      resource,
      namespace,
      object: structuredClone(object),
    };
    this.history.push(event);
    for (const watcher of this.watchers) this.deliver(watcher, event);
    if (resource === 'pods') this.syncClaims(namespace, object.metadata.name as string);
    // The reclaim policy Delete: a claim's storage goes with it.
    if (resource === 'persistentvolumeclaims' && type === 'DELETED') {
      this.releaseStorage(object.metadata.uid as string);
    }
    // A pod gone: claims being deleted that no pod uses now go (pvc-protection).
    if (resource === 'pods' && type === 'DELETED') this.releaseClaims(namespace);
  }

  private remove(resource: string, namespace: string, name: string): void {
    const stored = this.store.get(`${resource}/${namespace}/${name}`);
    if (!stored) return;
    this.write(resource, namespace, stored.object, 'DELETED');
    // The garbage collector: what the object owned goes with it (a pod gracefully), once none of
    // its owners is left; while another owner is there, only the reference to this one goes.
    const uid = stored.object.metadata.uid;
    for (const other of [...this.store.values()]) {
      const refs: Obj[] = other.object.metadata.ownerReferences ?? [];
      if (!refs.some((ref) => ref.uid === uid)) continue;
      if (refs.some((ref) => ref.uid !== uid && this.exists(ref.uid))) {
        other.object.metadata.ownerReferences = refs.filter((ref) => ref.uid !== uid);
        this.write(other.resource, other.namespace, other.object, 'MODIFIED');
        continue;
      }
      const otherName = other.object.metadata.name as string;
      if (other.resource === 'pods') {
        other.object.metadata.deletionTimestamp = new Date().toISOString();
        this.write('pods', other.namespace, other.object, 'MODIFIED');
        void this.terminate(other.namespace, otherName, other.object.metadata.uid as string);
      } else this.remove(other.resource, other.namespace, otherName);
    }
  }

  /** Whether an object of that uid is stored (a pod being deleted still is). */
  private exists(uid: string): boolean {
    return [...this.store.values()].some((s) => s.object.metadata.uid === uid);
  }

  /**
   * agent-sandbox's controller, the part the provider relies on: a Sandbox's claims from its
   * volumeClaimTemplates (`<template>-<Sandbox>`, controlled by it) and its pod, named like it,
   * with its podTemplate's labels, annotations and spec (the claims as the volumes of their
   * templates' names), owned by it; no pod while its operatingMode is Suspended (one there is
   * deleted), one made again once it is Running; the Sandbox deleted at its shutdownTime when its
   * shutdownPolicy is Delete.
   */
  private sandboxController(namespace: string, sandbox: Obj): void {
    const { name, uid } = sandbox.metadata;
    for (const template of sandbox.spec.volumeClaimTemplates ?? []) {
      const claimName = `${template.metadata.name}-${name}`;
      if (this.get('persistentvolumeclaims', namespace, claimName)) continue;
      const claim: Obj = {
        apiVersion: 'v1',
        kind: 'PersistentVolumeClaim',
        metadata: {
          name: claimName,
          namespace,
          labels: { ...template.metadata.labels, 'agents.x-k8s.io/sandbox-name-hash': 'double' },
          ownerReferences: [this.controllerRef(sandbox)],
        },
        spec: structuredClone(template.spec),
      };
      const problems = this.validate(
        'v1',
        'persistentvolumeclaims',
        'PersistentVolumeClaim',
        claim,
      );
      if (problems) {
        this.invalid.push({ path: `Sandbox ${name}'s claim ${claimName}`, problems });
        continue;
      }
      claim.metadata.uid = randomUUID();
      claim.metadata.creationTimestamp = new Date().toISOString();
      claim.status = { phase: 'Pending' };
      this.write('persistentvolumeclaims', namespace, claim, 'ADDED');
      this.provision(namespace, claimName);
    }
    if (sandbox.spec.operatingMode !== 'Suspended') this.makeSandboxPod(namespace, sandbox);
    this.scheduleShutdown(namespace, name, uid);
  }

  /** A Sandbox's pod, made shortly (as its controller does) unless it changed meanwhile. */
  private makeSandboxPod(namespace: string, sandbox: Obj): void {
    const { name, uid } = sandbox.metadata;
    const template = sandbox.spec.podTemplate;
    const spec = structuredClone(template.spec);
    const claimVolumes = (sandbox.spec.volumeClaimTemplates ?? []).map((t: Obj) => ({
      name: t.metadata.name,
      persistentVolumeClaim: { claimName: `${t.metadata.name}-${name}` },
    }));
    const named = new Set(claimVolumes.map((v: Obj) => v.name));
    spec.volumes = [
      ...(spec.volumes ?? []).filter((v: Obj) => !named.has(v.name)),
      ...claimVolumes,
    ];
    const pod: Obj = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {
        name,
        namespace,
        labels: { ...template.metadata?.labels, 'agents.x-k8s.io/sandbox-name-hash': 'double' },
        ...(template.metadata?.annotations ? { annotations: template.metadata.annotations } : {}),
        ownerReferences: [
          {
            apiVersion: sandbox.apiVersion,
            kind: 'Sandbox',
            name,
            uid,
            controller: true,
            blockOwnerDeletion: true,
          },
        ],
        uid: randomUUID(),
        creationTimestamp: new Date().toISOString(),
      },
      spec,
      status: { phase: 'Pending', qosClass: 'Burstable' },
    };
    const problems = this.validate('v1', 'pods', 'Pod', pod);
    if (problems) {
      this.invalid.push({ path: `Sandbox ${name}'s pod`, problems });
      return;
    }
    setTimeout(() => {
      const now = this.get('sandboxes', namespace, name);
      if (!now || now.metadata.uid !== uid || now.spec.operatingMode === 'Suspended') return;
      if (this.get('pods', namespace, name)) return;
      this.write('pods', namespace, pod, 'ADDED');
      void this.kubelet(namespace, name);
    }, 5);
  }

  /**
   * A Sandbox changed (a patch): Suspended deletes its pod (gracefully, its claims kept);
   * Running makes one once none is left; its shutdownTime is read again.
   */
  private reconcileSandbox(namespace: string, name: string): void {
    const sandbox = this.get('sandboxes', namespace, name);
    if (!sandbox) return;
    const pod = this.get('pods', namespace, name);
    if (sandbox.spec.operatingMode === 'Suspended') {
      if (pod && !pod.metadata.deletionTimestamp) {
        pod.metadata.deletionTimestamp = new Date(Date.now() + 1000).toISOString();
        pod.metadata.deletionGracePeriodSeconds = 1;
        this.write('pods', namespace, pod, 'MODIFIED');
        void this.terminate(namespace, name, pod.metadata.uid as string);
      }
    } else if (pod?.metadata.deletionTimestamp) {
      // Running again while its pod still goes: a new one once it is gone.
      const wait = async () => {
        while (this.get('pods', namespace, name) && !this.closing) await sleep(20);
        const now = this.get('sandboxes', namespace, name);
        if (now && now.metadata.uid === sandbox.metadata.uid) this.makeSandboxPod(namespace, now);
      };
      void wait();
    } else if (!pod) this.makeSandboxPod(namespace, sandbox);
    this.scheduleShutdown(namespace, name, sandbox.metadata.uid);
  }

  /**
   * The provisioner: a new claim of a class that binds at once gets its storage now; one that
   * waits for its first consumer says so; one the cluster cannot give storage gets the events a
   * real provisioner writes and stays Pending.
   */
  private provision(namespace: string, name: string): void {
    const claim = this.get('persistentvolumeclaims', namespace, name);
    if (!claim) return;
    const found = this.storageClassOf(claim);
    if ('problem' in found) {
      this.objectEvent(
        namespace,
        claim,
        'PersistentVolumeClaim',
        found.type,
        found.reason,
        found.problem,
      );
      return;
    }
    if (found.storageClass.binding === 'WaitForFirstConsumer') {
      this.objectEvent(
        namespace,
        claim,
        'PersistentVolumeClaim',
        'Normal',
        'WaitForFirstConsumer',
        'waiting for first consumer to be created before binding',
      );
      return;
    }
    this.bind(namespace, claim);
  }

  /** A claim's StorageClass, or why it can have none (the event a provisioner would write). */
  private storageClassOf(
    claim: Obj,
  ):
    | { name: string; storageClass: StorageClassDouble }
    | { type: 'Normal' | 'Warning'; reason: string; problem: string } {
    const classes = this.options.storageClasses ?? STORAGE_CLASSES;
    const name =
      claim.spec.storageClassName ??
      (this.options.defaultStorageClass === undefined
        ? 'standard'
        : this.options.defaultStorageClass);
    if (!name) {
      return {
        type: 'Normal',
        reason: 'FailedBinding',
        problem: 'no persistent volumes available for this claim and no storage class is set',
      };
    }
    const storageClass = classes[name];
    if (!storageClass) {
      return {
        type: 'Warning',
        reason: 'ProvisioningFailed',
        problem: `storageclass.storage.k8s.io "${name}" not found`,
      };
    }
    const mode = (claim.spec.accessModes ?? []).find(
      (m: string) => !storageClass.accessModes.includes(m),
    );
    if (mode) {
      return {
        type: 'Warning',
        reason: 'ProvisioningFailed',
        problem: `failed to provision volume with StorageClass "${name}": rpc error: code = InvalidArgument desc = Volume capabilities not supported: access mode ${mode}`,
      };
    }
    return { name, storageClass };
  }

  /** Gives a claim its storage (a tmpfs of its size, or a folder) and marks it Bound. */
  private bind(namespace: string, claim: Obj): void {
    if (claim.status?.phase === 'Bound') return;
    const found = this.storageClassOf(claim);
    if ('problem' in found) return;
    const dir = this.storageDir(claim.metadata.uid);
    mkdirSync(dir, { recursive: true });
    const size = claim.spec.resources?.requests?.storage as string;
    if (found.storageClass.storage === 'block') {
      execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size},mode=0755`, 'abx-pv', dir]);
      this.mounted.add(dir);
    }
    claim.spec.volumeName = `pvc-${claim.metadata.uid}`;
    claim.spec.storageClassName = found.name;
    claim.status = {
      phase: 'Bound',
      accessModes: claim.spec.accessModes,
      capacity: { storage: size },
    };
    this.write('persistentvolumeclaims', namespace, claim, 'MODIFIED');
    this.objectEvent(
      namespace,
      claim,
      'PersistentVolumeClaim',
      'Normal',
      'ProvisioningSucceeded',
      `Successfully provisioned volume pvc-${claim.metadata.uid}`,
    );
  }

  /** Where the storage of the claim of `uid` is on this host. */
  private storageDir(uid: string): string {
    return join(this.options.dir, 'pv', uid);
  }

  /** The storage of a deleted claim goes (its reclaim policy: Delete). */
  private releaseStorage(uid: string): void {
    const dir = this.storageDir(uid);
    if (this.mounted.delete(dir)) unmount(dir);
    rmSync(dir, { recursive: true, force: true });
  }

  /** Pods (not ended) whose volumes name the claim. */
  private claimUsers(namespace: string, claim: string): string[] {
    return [...this.store.values()]
      .filter((s) => s.resource === 'pods' && s.namespace === namespace)
      .filter((s) =>
        (s.object.spec.volumes ?? []).some(
          (v: Obj) => v.persistentVolumeClaim?.claimName === claim,
        ),
      )
      .map((s) => s.object.metadata.name as string);
  }

  /** Claims being deleted that no pod uses any more go now (pvc-protection's finalizer). */
  private releaseClaims(namespace: string): void {
    for (const stored of [...this.store.values()]) {
      if (stored.resource !== 'persistentvolumeclaims' || stored.namespace !== namespace) continue;
      const claim = stored.object;
      if (!claim.metadata.deletionTimestamp) continue;
      if (this.claimUsers(namespace, claim.metadata.name).length > 0) continue;
      this.remove('persistentvolumeclaims', namespace, claim.metadata.name);
    }
  }

  /**
   * Why a pod's claims keep it from being scheduled, or undefined when they are all bound (a
   * claim waiting for its first consumer is bound now).
   */
  private claimsUnready(namespace: string, pod: Obj): string | undefined {
    for (const volume of pod.spec.volumes ?? []) {
      const claimName = volume.persistentVolumeClaim?.claimName as string | undefined;
      if (!claimName) continue;
      const claim = this.get('persistentvolumeclaims', namespace, claimName);
      if (!claim) return `0/1 nodes are available: persistentvolumeclaim "${claimName}" not found.`;
      if (claim.metadata.deletionTimestamp) {
        return `0/1 nodes are available: persistentvolumeclaim "${claimName}" is being deleted.`;
      }
      if (claim.status?.phase === 'Bound') continue;
      const found = this.storageClassOf(claim);
      if (!('problem' in found) && found.storageClass.binding === 'WaitForFirstConsumer') {
        this.bind(namespace, claim);
        continue;
      }
      return '0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.';
    }
    return undefined;
  }

  /**
   * metrics-server's PodMetrics of a running pod, measured from its processes: CPU time (all of
   * them, children they reaped included) since the previous reading as cores, resident memory.
   */
  private podMetrics(pod: Obj): Obj | undefined {
    if (pod.status?.phase !== 'Running' || pod.metadata.deletionTimestamp) return undefined;
    const { name, namespace, uid } = pod.metadata;
    const pids = this.livePids(name).flatMap((pid) => processTree(pid));
    let ticks = 0;
    let rss = 0;
    for (const pid of new Set(pids)) {
      try {
        const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
        // utime, stime, cutime, cstime: fields 14-17 of stat(5), 12-15 after the comm.
        for (const i of [11, 12, 13, 14]) ticks += Number(fields[i] ?? 0);
        rss += Number(readFileSync(`/proc/${pid}/statm`, 'utf8').split(' ')[1] ?? 0) * 4096;
      } catch {
        // ended meanwhile
      }
    }
    const now = Date.now();
    const before = this.cpuReadings.get(uid) ?? {
      at: Date.parse(pod.status.startTime ?? pod.metadata.creationTimestamp),
      ticks: 0,
    };
    const window = Math.max(0.001, (now - before.at) / 1000);
    const cores = Math.max(0, (ticks - before.ticks) / CLK_TCK / window);
    this.cpuReadings.set(uid, { at: now, ticks });
    return {
      kind: 'PodMetrics',
      apiVersion: `${METRICS_GROUP}/v1beta1`,
      metadata: {
        name,
        namespace,
        labels: pod.metadata.labels,
        creationTimestamp: new Date(now).toISOString(),
      },
      timestamp: new Date(now).toISOString(),
      window: `${window.toFixed(3)}s`,
      containers: [
        {
          name: pod.spec.containers[0].name,
          usage: { cpu: `${Math.round(cores * 1e9)}n`, memory: `${Math.round(rss / 1024)}Ki` },
        },
      ],
    };
  }

  /**
   * agent-sandbox's SandboxWarmPool controller, the part the provider relies on: each pool keeps
   * `spec.replicas` Sandboxes (named `<pool>-<5 characters>`, controlled by the pool) made from
   * its SandboxTemplate's podTemplate, replenished when a claim adopts one; status.replicas.
   */
  private reconcilePools(namespace: string): void {
    for (const stored of [...this.store.values()]) {
      if (stored.resource !== 'sandboxwarmpools' || stored.namespace !== namespace) continue;
      const pool = stored.object;
      const template = this.get('sandboxtemplates', namespace, pool.spec.sandboxTemplateRef.name);
      if (!template) continue;
      const owned = this.ownedBy('sandboxes', namespace, pool.metadata.uid);
      for (let i = owned.length; i < (pool.spec.replicas ?? 1); i++) {
        const name = `${pool.metadata.name}-${randomUUID().replace(/-/g, '').slice(0, 5)}`;
        this.makeSandbox(namespace, name, template, pool);
      }
      const replicas = this.ownedBy('sandboxes', namespace, pool.metadata.uid).length;
      if (pool.status?.replicas !== replicas) {
        pool.status = {
          ...pool.status,
          replicas,
          selector: `agents.x-k8s.io/pool=${pool.metadata.name}`,
        };
        this.checkedWrite('sandboxwarmpools', namespace, pool);
      }
    }
  }

  /** Objects of `resource` whose controller is the object of `uid`. */
  private ownedBy(resource: string, namespace: string, uid: string): Obj[] {
    return [...this.store.values()]
      .filter(
        (s) =>
          s.resource === resource &&
          s.namespace === namespace &&
          s.object.metadata.ownerReferences?.some((r: Obj) => r.uid === uid && r.controller),
      )
      .map((s) => s.object);
  }

  /** A controller's write of a stored object, validated as the API server would. */
  private checkedWrite(resource: string, namespace: string, object: Obj): void {
    const problems = this.validate(object.apiVersion, resource, object.kind, object);
    if (problems) {
      this.invalid.push({ path: `${object.kind} ${object.metadata.name} (controller)`, problems });
      return;
    }
    this.write(resource, namespace, object, 'MODIFIED');
  }

  /** A Sandbox made by a controller from a SandboxTemplate, controlled by `owner`. */
  private makeSandbox(namespace: string, name: string, template: Obj, owner: Obj): void {
    const sandbox: Obj = {
      apiVersion: 'agents.x-k8s.io/v1beta1',
      kind: 'Sandbox',
      metadata: {
        name,
        namespace,
        labels: { 'agents.x-k8s.io/sandbox-template-ref-hash': 'double' },
        annotations: { 'agents.x-k8s.io/sandbox-template-ref': template.metadata.name },
        ownerReferences: [this.controllerRef(owner)],
      },
      spec: { podTemplate: structuredClone(template.spec.podTemplate) },
    };
    const problems = this.validate(sandbox.apiVersion, 'sandboxes', 'Sandbox', sandbox);
    if (problems) {
      this.invalid.push({ path: `Sandbox ${name} (controller)`, problems });
      return;
    }
    sandbox.metadata.uid = randomUUID();
    sandbox.metadata.creationTimestamp = new Date().toISOString();
    this.write('sandboxes', namespace, sandbox, 'ADDED');
    this.sandboxController(namespace, sandbox);
  }

  private controllerRef(owner: Obj): Obj {
    return {
      apiVersion: owner.apiVersion,
      kind: owner.kind,
      name: owner.metadata.name,
      uid: owner.metadata.uid,
      controller: true,
      blockOwnerDeletion: true,
    };
  }

  /** Whether a pod is Ready, and its address. */
  private podReady(pod: Obj | undefined): string | undefined {
    const ready = pod?.status?.conditions?.some(
      (c: Obj) => c.type === 'Ready' && c.status === 'True',
    );
    return ready && !pod?.metadata.deletionTimestamp ? pod?.status?.podIP : undefined;
  }

  /**
   * agent-sandbox's SandboxClaim controller, the part the provider relies on: a new claim adopts
   * a Sandbox of its warm pool (one whose pod is ready first; its controller becomes the claim),
   * else gets a Sandbox of its own named like it from the pool's template; the pool replenishes;
   * the claim's status says the Sandbox's name, its pod's IPs and the Ready condition.
   */
  private claimController(namespace: string, name: string): void {
    const claim = this.get('sandboxclaims', namespace, name);
    if (!claim || !this.bindClaims) return;
    const pool = this.get('sandboxwarmpools', namespace, claim.spec.warmPoolRef.name);
    const template =
      pool && this.get('sandboxtemplates', namespace, pool.spec.sandboxTemplateRef.name);
    if (!pool || !template) {
      this.setClaimStatus(
        claim,
        undefined,
        'WarmPoolNotFound',
        `SandboxWarmPool "${claim.spec.warmPoolRef.name}" not found`,
      );
      return;
    }
    const candidates = this.ownedBy('sandboxes', namespace, pool.metadata.uid).sort(
      (a, b) =>
        Number(Boolean(this.podReady(this.get('pods', namespace, b.metadata.name)))) -
        Number(Boolean(this.podReady(this.get('pods', namespace, a.metadata.name)))),
    );
    const adopted = candidates[0];
    let sandboxName: string;
    if (adopted) {
      adopted.metadata.ownerReferences = [this.controllerRef(claim)];
      this.checkedWrite('sandboxes', namespace, adopted);
      sandboxName = adopted.metadata.name;
    } else {
      this.makeSandbox(namespace, name, template, claim);
      sandboxName = name;
    }
    claim.status = { sandbox: { name: sandboxName } };
    this.syncClaims(namespace, sandboxName);
    this.reconcilePools(namespace);
    this.scheduleClaimShutdown(namespace, name, claim.metadata.uid);
  }

  /** The status of the claims bound to the Sandbox (and pod) `sandboxName`, from its pod. */
  private syncClaims(namespace: string, sandboxName: string): void {
    for (const stored of [...this.store.values()]) {
      if (stored.resource !== 'sandboxclaims' || stored.namespace !== namespace) continue;
      const claim = stored.object;
      if (claim.status?.sandbox?.name !== sandboxName) continue;
      const address = this.podReady(this.get('pods', namespace, sandboxName));
      this.setClaimStatus(
        claim,
        sandboxName,
        address ? 'DependenciesReady' : 'DependenciesNotReady',
        address ? 'Pod is Ready' : 'Pod exists with phase: Pending',
        address,
      );
    }
  }

  private setClaimStatus(
    claim: Obj,
    sandboxName: string | undefined,
    reason: string,
    message: string,
    podIP?: string,
  ): void {
    const ready = podIP ? 'True' : 'False';
    const before = claim.status?.conditions?.[0];
    if (
      before?.status === ready &&
      before.reason === reason &&
      claim.status?.sandbox?.podIPs?.[0] === podIP
    )
      return;
    claim.status = {
      ...(sandboxName
        ? { sandbox: { name: sandboxName, ...(podIP ? { podIPs: [podIP] } : {}) } }
        : {}),
      conditions: [
        {
          type: 'Ready',
          status: ready,
          reason,
          message,
          lastTransitionTime: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
          observedGeneration: claim.metadata.generation ?? 1,
        },
      ],
    };
    this.checkedWrite('sandboxclaims', claim.metadata.namespace, claim);
  }

  /** Deletes a claim at its lifecycle's shutdownTime with shutdownPolicy Delete (its Sandbox goes with it). */
  private scheduleClaimShutdown(namespace: string, name: string, uid: string): void {
    const claim = this.get('sandboxclaims', namespace, name);
    const lifecycle = claim?.spec.lifecycle;
    if (claim?.metadata.uid !== uid || lifecycle?.shutdownPolicy !== 'Delete') return;
    const at = Date.parse(lifecycle.shutdownTime);
    if (!Number.isFinite(at)) return;
    const timer = setTimeout(
      () => {
        const now = this.get('sandboxclaims', namespace, name);
        if (now?.metadata.uid !== uid) return;
        if (Date.parse(now.spec.lifecycle?.shutdownTime) > Date.now())
          this.scheduleClaimShutdown(namespace, name, uid);
        else this.remove('sandboxclaims', namespace, name);
      },
      Math.max(0, at - Date.now()),
    );
    timer.unref();
  }

  /** Deletes a Sandbox at its shutdownTime (read again when the timer fires: it may have moved). */
  private scheduleShutdown(namespace: string, name: string, uid: string): void {
    const sandbox = this.get('sandboxes', namespace, name);
    if (sandbox?.metadata.uid !== uid || sandbox.spec.shutdownPolicy !== 'Delete') return;
    const at = sandbox.spec.shutdownTime ? Date.parse(sandbox.spec.shutdownTime) : Number.NaN;
    if (!Number.isFinite(at)) return;
    const timer = setTimeout(
      () => {
        const now = this.get('sandboxes', namespace, name);
        if (now?.metadata.uid !== uid) return;
        // No shutdownTime any more (a suspended Sandbox's was taken off): it does not expire.
        if (!now.spec.shutdownTime) return;
        if (Date.parse(now.spec.shutdownTime) > Date.now())
          this.scheduleShutdown(namespace, name, uid);
        else this.remove('sandboxes', namespace, name);
      },
      Math.max(0, at - Date.now()),
    );
    timer.unref();
  }

  private deliver(
    watcher: {
      resource: string;
      namespace: string | undefined;
      labels: string | null;
      fields: string | null;
      res: ServerResponse;
    },
    event: WatchEvent,
  ): void {
    if (
      watcher.resource !== event.resource ||
      (watcher.namespace && watcher.namespace !== event.namespace)
    )
      return;
    if (
      !matchesLabels(watcher.labels, event.object.metadata.labels) ||
      !matchesFields(watcher.fields, event.object)
    )
      return;
    watcher.res.write(`${JSON.stringify({ type: event.type, object: event.object })}\n`);
  }

  private watch(
    res: ServerResponse,
    resource: string,
    namespace: string,
    labels: string | null,
    fields: string | null,
    from: string | null,
  ): void {
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    const watcher = { resource, namespace, labels, fields, res };
    const since = from ? Number(from) : this.rv;
    if (from && since < (this.history[0]?.rv ?? 1) - 1) {
      res.end(
        `${JSON.stringify({ type: 'ERROR', object: status(410, 'Expired', `too old resource version: ${from}`) })}\n`,
      );
      return;
    }
    for (const event of this.history) if (event.rv > since) this.deliver(watcher, event);
    this.watchers.add(watcher);
    res.on('close', () => this.watchers.delete(watcher));
  }

  private event(
    namespace: string,
    pod: Obj,
    type: 'Normal' | 'Warning',
    reason: string,
    message: string,
  ): void {
    this.objectEvent(namespace, pod, 'Pod', type, reason, message);
  }

  private objectEvent(
    namespace: string,
    object: Obj,
    kind: string,
    type: 'Normal' | 'Warning',
    reason: string,
    message: string,
  ): void {
    const pod = object;
    const name = `${pod.metadata.name}.${(this.rv + 1).toString(16)}`;
    this.write(
      'events',
      namespace,
      {
        apiVersion: 'v1',
        kind: 'Event',
        metadata: {
          name,
          namespace,
          uid: randomUUID(),
          creationTimestamp: new Date().toISOString(),
        },
        involvedObject: {
          kind,
          namespace,
          name: pod.metadata.name,
          uid: pod.metadata.uid,
          apiVersion: 'v1',
        },
        type,
        reason,
        message,
        source:
          kind === 'Pod'
            ? { component: 'kubelet', host: NODE }
            : { component: 'persistentvolume-controller' },
        firstTimestamp: new Date().toISOString(),
        lastTimestamp: new Date().toISOString(),
        count: 1,
      },
      'ADDED',
    );
  }

  /** The pod as stored now (undefined once deleted, or replaced by another of the same name). */
  private current(namespace: string, name: string, uid: string): Obj | undefined {
    const pod = this.get('pods', namespace, name);
    return pod?.metadata.uid === uid ? pod : undefined;
  }

  private update(namespace: string, pod: Obj, change: (status: Obj) => void): void {
    const now = this.current(namespace, pod.metadata.name, pod.metadata.uid);
    if (!now) return;
    change(now.status);
    this.write('pods', namespace, now, 'MODIFIED');
  }

  /** What a node does with a new pod: schedule, pull, mount, run the init containers, run, probe. */
  /**
   * A node's kubelet running a pod. A pod deleted while it starts (its folder removed under it)
   * ends its kubelet quietly, as on a node; any other failure is the double's own and surfaces.
   */
  private async kubelet(namespace: string, name: string): Promise<void> {
    const uid = (this.get('pods', namespace, name) as Obj).metadata.uid as string;
    await this.runPod(namespace, name).catch((error: NodeJS.ErrnoException) => {
      if (this.closing) return; // the test is over and has removed the nodes' folders
      if (error.code === 'ENOENT' && !this.current(namespace, name, uid)) return;
      throw error;
    });
  }

  private async runPod(namespace: string, name: string): Promise<void> {
    const pod = this.get('pods', namespace, name) as Obj;
    const uid = pod.metadata.uid as string;
    const key = `pods/${namespace}/${name}`;
    const fate = this.fate(pod);
    const at = () => new Date().toISOString();
    if (fate.kind === 'unschedulable') {
      const message =
        fate.message ??
        '0/1 nodes are available: 1 Insufficient memory. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.';
      this.update(namespace, pod, (s) => {
        s.conditions = [
          {
            type: 'PodScheduled',
            status: 'False',
            reason: 'Unschedulable',
            message,
            lastTransitionTime: at(),
          },
        ];
      });
      this.event(namespace, pod, 'Warning', 'FailedScheduling', message);
      return;
    }
    if (fate.kind === 'hold') await fate.until;
    // The scheduler waits for the pod's claims (and binds those that wait for it), trying again.
    for (let told = false; ; ) {
      const unready = this.claimsUnready(namespace, pod);
      if (!unready) break;
      if (!this.current(namespace, name, uid) || this.closing) return;
      if (!told) {
        told = true;
        this.update(namespace, pod, (s) => {
          s.conditions = [
            {
              type: 'PodScheduled',
              status: 'False',
              reason: 'Unschedulable',
              message: unready,
              lastTransitionTime: at(),
            },
          ];
        });
        this.event(namespace, pod, 'Warning', 'FailedScheduling', unready);
      }
      await sleep(50);
    }
    await sleep(5);
    this.update(namespace, pod, (s) => {
      s.conditions = [{ type: 'PodScheduled', status: 'True', lastTransitionTime: at() }];
    });
    const live = this.current(namespace, name, uid);
    if (!live) return;
    live.spec.nodeName = NODE;
    this.event(
      namespace,
      pod,
      'Normal',
      'Scheduled',
      `Successfully assigned ${namespace}/${name} to ${NODE}`,
    );
    if (fate.kind === 'image-pull-error') {
      const image = pod.spec.containers[0].image;
      const message =
        fate.message ??
        `failed to pull and unpack image "${image}": failed to resolve reference "${image}": not found`;
      this.event(
        namespace,
        pod,
        'Warning',
        'Failed',
        `Failed to pull image "${image}": ${message}`,
      );
      this.update(namespace, pod, (s) => {
        s.containerStatuses = [
          {
            name: pod.spec.containers[0].name,
            image,
            imageID: '',
            ready: false,
            restartCount: 0,
            started: false,
            state: { waiting: { reason: 'ErrImagePull', message } },
          },
        ];
      });
      return;
    }
    // Volumes: host folders.
    const podDir = join(this.options.dir, uid);
    const volumes: Record<string, string> = {};
    const fsGroup = pod.spec.securityContext?.fsGroup as number | undefined;
    /** Volumes every mount of which is read-only (a claim mounted readOnly). */
    const readOnly = new Set<string>();
    for (const volume of pod.spec.volumes ?? []) {
      if (volume.persistentVolumeClaim) {
        const claim = this.get(
          'persistentvolumeclaims',
          namespace,
          volume.persistentVolumeClaim.claimName,
        );
        if (!claim || !this.current(namespace, name, uid)) return;
        const dir = this.storageDir(claim.metadata.uid);
        volumes[volume.name] = dir;
        if (volume.persistentVolumeClaim.readOnly) readOnly.add(volume.name);
        // fsGroup, OnRootMismatch: the volume's root (and what is in it) becomes the group's,
        // setgid, writable by it, unless its root is so already.
        if (fsGroup !== undefined && statSync(dir).gid !== fsGroup) {
          for (const path of walk(dir)) {
            chownSync(path, statSync(path).uid, fsGroup);
            if (statSync(path).isDirectory())
              chmodSync(path, (statSync(path).mode & 0o7777) | 0o2070);
          }
        }
        continue;
      }
      const dir = join(podDir, 'volumes', volume.name);
      mkdirSync(dir, { recursive: true });
      volumes[volume.name] = dir;
      if (volume.emptyDir) chmodSync(dir, 0o777);
      if (volume.secret) {
        // The kubelet waits for the Secret (FailedMount events while it is missing).
        let secret = this.get('secrets', namespace, volume.secret.secretName);
        for (let tries = 1; !secret; tries++) {
          if (!this.current(namespace, name, uid)) return;
          if (tries === 200) {
            this.event(
              namespace,
              pod,
              'Warning',
              'FailedMount',
              `MountVolume.SetUp failed for volume "${volume.name}" : secret "${volume.secret.secretName}" not found`,
            );
          }
          await sleep(10);
          secret = this.get('secrets', namespace, volume.secret.secretName);
        }
        for (const [file, value] of Object.entries(secret.data ?? {})) {
          writeFileSync(join(dir, file), Buffer.from(value as string, 'base64'));
          chmodSync(join(dir, file), volume.secret.defaultMode ?? 0o644);
          if (fsGroup !== undefined) chownSync(join(dir, file), 0, fsGroup);
        }
        chmodSync(dir, 0o755);
      }
    }
    const address = freeAddress(this.addresses);
    this.addresses.add(address);
    /** A host path of the node's folder or the runtime image as the staged mounts see it. */
    const staged = (path: string): string => {
      for (const [base, at] of [
        [this.options.dir, `${STAGE}/node`],
        [this.options.runtimeImageDir, `${STAGE}/image`],
      ] as const) {
        if (path === base || path.startsWith(`${base}/`)) return `${at}${path.slice(base.length)}`;
      }
      return path;
    };
    const runContainer = async (container: Obj, init: boolean): Promise<Running | string> => {
      if (this.closing) throw new Error('the Kubernetes double is closed');
      const security = { ...pod.spec.securityContext, ...container.securityContext };
      const env: Record<string, string> = {};
      for (const variable of container.env ?? []) {
        if (variable.valueFrom?.fieldRef?.fieldPath === 'status.podIP')
          env[variable.name] = address;
        else env[variable.name] = String(variable.value ?? '');
      }
      const expand = (text: string) =>
        text.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (all, v: string) => env[v] ?? all);
      const argv = [...(container.command ?? []), ...(container.args ?? [])].map(expand);
      const mounts: string[] = [];
      const tops = new Set<string>();
      const image = init ? this.options.runtimeImageDir : undefined;
      if (image) {
        tops.add('/opt');
        mounts.push(
          `mkdir -p /opt/abx && mount --bind ${quote(staged(image))} /opt/abx && mount -o remount,bind,ro /opt/abx`,
        );
      }
      for (const mount of container.volumeMounts ?? []) {
        const top = `/${(mount.mountPath as string).split('/')[1]}`;
        if (['/opt', '/mnt', '/run', '/home'].includes(top)) tops.add(top);
        let source = volumes[mount.name] as string;
        if (mount.subPath) {
          // The kubelet makes a subPath that is not there (as root).
          source = join(source, mount.subPath);
          mkdirSync(source, { recursive: true });
        }
        const ro = mount.readOnly || readOnly.has(mount.name);
        mounts.push(
          `mkdir -p ${quote(mount.mountPath)} && mount --bind ${quote(staged(source))} ${quote(mount.mountPath)}${ro ? ` && mount -o remount,bind,ro ${quote(mount.mountPath)}` : ''}`,
        );
      }
      const uidOf = Number(security.runAsUser ?? 0);
      const gid = Number(security.runAsGroup ?? uidOf);
      const passwd = join(podDir, `passwd-${container.name}`);
      // Stands for an image that has the user (as the provider's images must).
      writeFileSync(
        passwd,
        `root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n`,
      );
      const group = join(podDir, `group-${container.name}`);
      writeFileSync(group, 'root:x:0:\nuser:x:1000:\n');
      const workdir = container.workingDir as string | undefined;
      const script = [
        'set -e',
        `hostname ${quote(pod.spec.hostname ?? name)}`,
        // The host folders mounts come from, where no mount of the pod covers them (one at /tmp
        // would hide a scratch folder under /tmp): a tmpfs of the namespace's own at /srv.
        `mount -t tmpfs -o mode=700 abx-stage ${STAGE}`,
        `mkdir ${STAGE}/node ${STAGE}/image`,
        `mount --rbind ${quote(this.options.dir)} ${STAGE}/node`,
        `mount --bind ${quote(this.options.runtimeImageDir)} ${STAGE}/image`,
        ...[...tops].map((top) => `mount -t tmpfs -o mode=755 abx-double ${top}`),
        ...mounts,
        `mount --bind ${quote(staged(passwd))} /etc/passwd`,
        `mount --bind ${quote(staged(group))} /etc/group`,
        // Gone from its view once its mounts are made.
        `umount -l ${STAGE}`,
        ...(workdir
          ? [
              `if ! mkdir -p ${quote(workdir)} 2>/dev/null || ! cd ${quote(workdir)}; then echo "ABX-START-ERROR: chdir to cwd (\\"${workdir.replace(/[\\"$`]/g, '')}\\") set in config.json failed: no such file or directory" >&2; exit 128; fi`,
              `case ${quote(workdir)} in /home/*) chown ${uidOf}:${gid} ${quote(workdir)} ;; esac`,
            ]
          : []),
        `exec setpriv --reuid=${uidOf} --regid=${gid} ${fsGroup !== undefined ? `--groups=${fsGroup}` : '--clear-groups'} --inh-caps=-all --bounding-set=-all${security.allowPrivilegeEscalation === false ? ' --no-new-privs' : ''} -- env -i ${Object.entries(
          env,
        )
          .map(([k, v]) => quote(`${k}=${v}`))
          .join(' ')} ${argv.map(quote).join(' ')}`,
      ].join('\n');
      const child = spawn(
        'unshare',
        [
          '--mount',
          '--pid',
          '--uts',
          '--fork',
          '--kill-child',
          '--mount-proc',
          '--',
          '/bin/sh',
          '-c',
          script,
        ],
        {
          stdio: ['ignore', 'pipe', 'pipe'],
          env: { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' },
        },
      );
      let log = '';
      child.stdout?.on('data', (chunk: Buffer) => {
        log += chunk.toString();
      });
      child.stderr?.on('data', (chunk: Buffer) => {
        log += chunk.toString();
      });
      const exited = new Promise<number | null>((resolve) =>
        child.once('close', (code) => resolve(code)),
      );
      const running = { child, exited };
      const list = this.processes.get(key) ?? [];
      list.push(running);
      this.processes.set(key, list);
      writeFileSync(join(podDir, `${container.name}.log`), '');
      exited
        .then(
          () => writeFileSync(join(podDir, `${container.name}.log`), log),
          () => undefined,
        )
        .catch(() => {
          // the pod was deleted and its folder removed: no log to keep
        });
      if (!init) return running;
      const code = await exited;
      return code === 0 ? running : `exit code ${code}: ${log.trim().slice(-500)}`;
    };

    const initStatuses: Obj[] = [];
    for (const container of pod.spec.initContainers ?? []) {
      if (!this.current(namespace, name, uid)) return;
      const result = await runContainer(container, true);
      if (typeof result === 'string') {
        initStatuses.push({
          name: container.name,
          image: container.image,
          imageID: '',
          ready: false,
          restartCount: 0,
          state: { terminated: { exitCode: 1, reason: 'Error', message: result } },
        });
        this.update(namespace, pod, (s) => {
          s.phase = 'Failed';
          s.initContainerStatuses = initStatuses;
        });
        return;
      }
      initStatuses.push({
        name: container.name,
        image: container.image,
        imageID: '',
        ready: false,
        restartCount: 0,
        state: { terminated: { exitCode: 0, reason: 'Completed' } },
      });
    }
    if (!this.current(namespace, name, uid)) return;
    const main = pod.spec.containers[0] as Obj;
    const started = at();
    const running = (await runContainer(main, false)) as Running;
    this.update(namespace, pod, (s) => {
      s.phase = 'Running';
      s.podIP = address;
      s.podIPs = [{ ip: address }];
      s.hostIP = '127.0.0.1';
      s.startTime = started;
      s.initContainerStatuses = initStatuses;
      s.containerStatuses = [
        {
          name: main.name,
          image: main.image,
          imageID: '',
          ready: false,
          restartCount: 0,
          started: true,
          state: { running: { startedAt: started } },
        },
      ];
      s.conditions = [
        { type: 'PodScheduled', status: 'True', lastTransitionTime: started },
        { type: 'Initialized', status: 'True', lastTransitionTime: started },
        { type: 'ContainersReady', status: 'False', lastTransitionTime: started },
        { type: 'Ready', status: 'False', lastTransitionTime: started },
      ];
    });
    let ended = false;
    running.exited.then(
      (code) => {
        ended = true;
        this.addresses.delete(address);
        const startError = running.child.exitCode === 128;
        this.update(namespace, pod, (s) => {
          s.phase = code === 0 ? 'Succeeded' : 'Failed';
          for (const c of s.conditions ?? [])
            if (c.type === 'Ready' || c.type === 'ContainersReady') c.status = 'False';
          s.containerStatuses = [
            {
              name: main.name,
              image: main.image,
              imageID: '',
              ready: false,
              restartCount: 0,
              started: false,
              state: {
                terminated: {
                  exitCode: code ?? 137,
                  reason: startError ? 'StartError' : code === 0 ? 'Completed' : 'Error',
                  ...(startError
                    ? {
                        message: `failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: chdir to cwd ("${main.workingDir}") set in config.json failed: no such file or directory`,
                      }
                    : {}),
                  startedAt: started,
                  finishedAt: at(),
                },
              },
            },
          ];
        });
      },
      () => undefined,
    );
    // The readiness probe.
    const probe = main.readinessProbe?.httpGet;
    while (!ended && this.current(namespace, name, uid) && probe) {
      const ok = await new Promise<boolean>((resolve) => {
        const req = request(
          { host: address, port: probe.port, path: probe.path ?? ENVD_READY_PATH, timeout: 500 },
          (res) => {
            res.resume();
            resolve(res.statusCode === 200);
          },
        );
        req.on('error', () => resolve(false));
        req.on('timeout', () => req.destroy());
        req.end();
      });
      if (ok) {
        this.update(namespace, pod, (s) => {
          s.containerStatuses[0].ready = true;
          for (const c of s.conditions)
            if (c.type === 'Ready' || c.type === 'ContainersReady') c.status = 'True';
        });
        return;
      }
      await sleep(20);
    }
  }

  /** A graceful deletion: the containers are stopped, then the object goes. */
  private async terminate(namespace: string, name: string, uid: string): Promise<void> {
    const key = `pods/${namespace}/${name}`;
    await this.stopProcesses(key);
    const pod = this.current(namespace, name, uid);
    if (pod) this.remove('pods', namespace, name);
  }

  private async stopProcesses(key: string): Promise<void> {
    if (this.stopping.has(key)) {
      while (this.stopping.has(key)) await sleep(10);
      return;
    }
    this.stopping.add(key);
    try {
      const list = this.processes.get(key) ?? [];
      for (const { child } of list) killPod(child);
      await Promise.all(list.map((r) => r.exited));
      this.processes.delete(key);
    } finally {
      this.stopping.delete(key);
    }
  }
}

/**
 * Kills a container: its pid namespace's init (unshare's child) first, which takes every process
 * of the namespace with it (unshare's --kill-child does not survive the uid change of setpriv).
 */
function killPod(child: ChildProcess): void {
  const pid = child.pid;
  if (!pid || child.exitCode !== null || child.signalCode !== null) return;
  try {
    for (const init of readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' ')) {
      if (/^\d+$/.test(init)) process.kill(Number(init), 'SIGKILL');
    }
  } catch {
    // ended meanwhile
  }
  child.kill('SIGKILL');
}

/** Unmounts a claim's tmpfs (lazily: a pod's mount namespace may still hold it). */
function unmount(dir: string): void {
  try {
    execFileSync('umount', ['-l', dir], { stdio: 'ignore' });
  } catch {
    // not mounted
  }
}

/** A path and everything under it (no symlinks followed). */
function walk(path: string): string[] {
  const found = [path];
  if (!statSync(path).isDirectory()) return found;
  for (const entry of readdirSync(path, { withFileTypes: true })) {
    if (entry.isSymbolicLink()) continue;
    found.push(...walk(join(path, entry.name)));
  }
  return found;
}

/** A process and all its descendants (by /proc's children lists). */
function processTree(pid: number): number[] {
  const found = [pid];
  try {
    for (const task of readdirSync(`/proc/${pid}/task`)) {
      const children = readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8')
        .split(' ')
        .filter((text) => /^\d+$/.test(text));
      for (const child of children) found.push(...processTree(Number(child)));
    }
  } catch {
    // ended meanwhile
  }
  return found;
}

/** Pod rules the API server enforces beyond the schema (those the provider could break). */
function podRules(pod: Obj): string | undefined {
  const names = new Set((pod.spec.volumes ?? []).map((v: Obj) => v.name));
  for (const container of [...(pod.spec.initContainers ?? []), ...pod.spec.containers]) {
    for (const mount of container.volumeMounts ?? []) {
      if (!names.has(mount.name))
        return `spec.containers[${container.name}].volumeMounts.name: Not found: "${mount.name}"`;
    }
  }
  if (pod.spec.hostname && !/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(pod.spec.hostname)) {
    return `spec.hostname: Invalid value: "${pod.spec.hostname}"`;
  }
  for (const [key, value] of Object.entries(pod.metadata.labels ?? {})) {
    if (typeof value !== 'string' || value.length > 63)
      return `metadata.labels: Invalid value: "${key}"`;
  }
  return undefined;
}

/**
 * NetworkPolicy rules the API server enforces beyond the schema (Kubernetes'
 * pkg/apis/networking/validation): each ipBlock's `cidr` a CIDR and each `except` a CIDR strictly
 * inside it; ports of TCP, UDP or SCTP, numbers 1-65535; policyTypes Ingress or Egress.
 */
export function networkPolicyRules(policy: Obj): string | undefined {
  const spec = policy.spec ?? {};
  for (const type of spec.policyTypes ?? []) {
    if (!['Ingress', 'Egress'].includes(type))
      return `spec.policyTypes: Unsupported value: "${type}"`;
  }
  const rules = [
    ...(spec.egress ?? []).map((rule: Obj, i: number) => ({
      at: `spec.egress[${i}]`,
      peers: rule.to ?? [],
      ports: rule.ports ?? [],
    })),
    ...(spec.ingress ?? []).map((rule: Obj, i: number) => ({
      at: `spec.ingress[${i}]`,
      peers: rule.from ?? [],
      ports: rule.ports ?? [],
    })),
  ];
  const parse = (text: unknown): [ipaddr.IPv4 | ipaddr.IPv6, number] | undefined => {
    try {
      return typeof text === 'string' ? ipaddr.parseCIDR(text) : undefined;
    } catch {
      return undefined;
    }
  };
  for (const { at, peers, ports } of rules) {
    for (const [j, peer] of (peers as Obj[]).entries()) {
      const block = peer.ipBlock;
      if (!block) continue;
      if (peer.podSelector || peer.namespaceSelector) {
        return `${at}.to[${j}]: Forbidden: may not specify more than 1 peer type`;
      }
      const range = parse(block.cidr);
      if (!range) return `${at}.to[${j}].ipBlock.cidr: Invalid value: "${block.cidr}"`;
      for (const [k, text] of ((block.except ?? []) as string[]).entries()) {
        const except = parse(text);
        const where = `${at}.to[${j}].ipBlock.except[${k}]`;
        if (!except) return `${where}: Invalid value: "${text}"`;
        if (
          except[0].kind() !== range[0].kind() ||
          except[1] <= range[1] ||
          !except[0].match(range as never)
        ) {
          return `${where}: Invalid value: "${text}": must be a strict subset of \`cidr\``;
        }
      }
    }
    for (const [j, port] of (ports as Obj[]).entries()) {
      if (port.protocol !== undefined && !['TCP', 'UDP', 'SCTP'].includes(port.protocol)) {
        return `${at}.ports[${j}].protocol: Unsupported value: "${port.protocol}"`;
      }
      if (typeof port.port === 'number' && (port.port < 1 || port.port > 65535)) {
        return `${at}.ports[${j}].port: Invalid value: ${port.port}`;
      }
    }
  }
  return undefined;
}

/** A TCP port nothing listens on (an unreachable API server). */
export async function closedPort(): Promise<number> {
  const server = createNetServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * Why the double's kubelet cannot run pods here (it needs root for its namespaces and mounts,
 * and util-linux's unshare and setpriv), or undefined when it can: tests skip saying so.
 */
export function kubeletUnavailable(): string | undefined {
  if (process.getuid?.() !== 0) {
    return 'the API double’s kubelet needs root (mount namespaces, setpriv); run the tests as root, as CI does';
  }
  for (const tool of ['/usr/bin/unshare', '/usr/bin/setpriv']) {
    try {
      readFileSync(tool);
    } catch {
      return `${tool} is missing: apt-get install util-linux`;
    }
  }
  return undefined;
}
