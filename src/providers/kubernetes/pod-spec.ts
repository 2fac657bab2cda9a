import { createHash } from 'node:crypto';
import type { V1Pod, V1Secret } from '@kubernetes/client-node';
import {
  ENVD_PORT,
  SANDBOX_RUN_DIR,
  SANDBOX_RUNTIME_DIR,
} from '../../../runtime/protocol/constants.js';
import { InvalidArgumentError } from '../../errors.js';
import { SANDBOX_NODE } from '../portable-runtime.js';
import { ENVD_NODE_OPTIONS, type SandboxSpec, type VolumeMountSpec } from '../provider.js';

/** Labels every object of the provider carries: who manages it, which sandbox, which folder. */
export const MANAGED_BY_LABEL = 'abx.dev/managed-by';
export const MANAGED_BY = 'abx';
export const SANDBOX_ID_LABEL = 'abx.dev/sandbox-id';
/** A hash of the daemon's sandboxes folder: `sweepOrphans` only touches its own daemon's pods. */
export const SANDBOXES_LABEL = 'abx.dev/sandboxes';
export const TEMPLATE_ANNOTATION = 'abx.dev/template';
/**
 * The sandbox's `network` (`none`, `internet` or `host`): deploy/kubernetes' NetworkPolicies deny
 * egress to pods labelled `none`, which a pod cannot do by itself, and to those labelled
 * `internet` but for what their own NetworkPolicy allows (network-policy.ts).
 */
export const NETWORK_LABEL = 'abx.dev/network';

/** The uid and gid sandboxes run as (an image template's user; never root). */
export const SANDBOX_UID = 1000;
/** The main container's name. */
export const SANDBOX_CONTAINER = 'sandbox';
/** The init container that puts the portable runtime and the token in the pod's volumes. */
export const RUNTIME_CONTAINER = 'abx-runtime';
/** Where the init container sees the volumes it fills, and the token's Secret. */
export const INIT_RUNTIME_DIR = '/mnt/abx/runtime';
export const INIT_RUN_DIR = '/mnt/abx/run';
export const INIT_TOKEN_DIR = '/mnt/abx/token';
export const INIT_HOME_DIR = '/mnt/abx/home';
/**
 * On a home claim (see {@link PodContext.homeClaim}): the folder holding the user's home, and the
 * one mounted at /tmp. What else is at the claim's root is abx's own (the seed marker).
 */
export const HOME_SUBPATH = 'home';
export const TMP_SUBPATH = 'tmp';
/** At a home claim's root once the image's home was copied in (image templates). */
export const SEEDED_MARKER = '.abx-home-seeded';
/** The init container that copies an image's home onto a new home claim, once. */
export const SEED_CONTAINER = 'abx-home-seed';
/** The pod volume of the sandbox's home (an emptyDir, or its home claim). */
export const HOME_VOLUME = 'abx-home';
/** The key of the token in its Secret, and so the file name under {@link INIT_TOKEN_DIR}. */
export const TOKEN_KEY = 'token';
/** Where envd reads its token in the main container (and deletes it before serving). */
export const POD_TOKEN_FILE = `${SANDBOX_RUN_DIR}/token`;
/** The variable the kubelet sets to the pod's address (envd listens there). */
const POD_IP_ENV = 'ABX_POD_IP';
const BASE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** Room for envd's socket, the port sockets and the token (a memory-backed emptyDir). */
const RUN_DIR_SIZE = '1Mi';

/**
 * What the init container runs, with the runtime image's own node (`/opt/abx` is that image's
 * portable runtime): copies the runtime into the shared emptyDir, and the token from its Secret
 * (mounted in the init container only) into the memory-backed run folder, where envd reads it and
 * deletes it before it serves. The main container never mounts the Secret.
 */
export function initScript(homeUser?: string, onClaim = false): string {
  return [
    "const fs = require('node:fs');",
    `fs.cpSync('${SANDBOX_RUNTIME_DIR}', '${INIT_RUNTIME_DIR}', { recursive: true, verbatimSymlinks: true });`,
    `fs.copyFileSync('${INIT_TOKEN_DIR}/${TOKEN_KEY}', '${INIT_RUN_DIR}/token');`,
    `fs.chmodSync('${INIT_RUN_DIR}/token', 0o600);`,
    `fs.mkdirSync('${INIT_RUN_DIR}/ports', { recursive: true, mode: 0o755 });`,
    // An emptyDir is root's: the user's own home is made in it, as the user.
    ...(homeUser && !onClaim
      ? [`fs.mkdirSync(${JSON.stringify(`${INIT_HOME_DIR}/${homeUser}`)}, { mode: 0o750 });`]
      : []),
    // A home claim (fsGroup makes it the user's group's): its home and /tmp folders, made on the
    // first start only; a wake finds them as the sandbox left them.
    ...(onClaim
      ? [
          `if (!fs.existsSync('${INIT_HOME_DIR}/${HOME_SUBPATH}')) fs.mkdirSync('${INIT_HOME_DIR}/${HOME_SUBPATH}', { mode: 0o750 });`,
          `if (!fs.existsSync('${INIT_HOME_DIR}/${TMP_SUBPATH}')) { fs.mkdirSync('${INIT_HOME_DIR}/${TMP_SUBPATH}'); fs.chmodSync('${INIT_HOME_DIR}/${TMP_SUBPATH}', 0o1777); }`,
        ]
      : []),
  ].join(' ');
}

/**
 * What the seed init container runs in the template's image (with the runtime's node): on a home
 * claim's first start, the image's home (`home`, when the image has one) is copied onto the
 * claim, as the user; the marker keeps a wake from copying it over what the sandbox changed.
 */
export function seedScript(home: string): string {
  const target = `${INIT_HOME_DIR}/${HOME_SUBPATH}`;
  return [
    "const fs = require('node:fs');",
    `if (!fs.existsSync('${INIT_HOME_DIR}/${SEEDED_MARKER}')) {`,
    `if (fs.existsSync(${JSON.stringify(home)})) fs.cpSync(${JSON.stringify(home)}, '${target}', { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });`,
    `fs.writeFileSync('${INIT_HOME_DIR}/${SEEDED_MARKER}', '');`,
    '}',
  ].join(' ');
}

/** The value of {@link SANDBOXES_LABEL}: 16 hex digits of the folder's SHA-256. */
export function sandboxesHash(sandboxesDir: string): string {
  return createHash('sha256').update(sandboxesDir).digest('hex').slice(0, 16);
}

/** The pod of sandbox `id`. */
export function podName(id: string): string {
  return `abx-${id}`;
}

/**
 * The PersistentVolumeClaim of sandbox `id`'s home (`--kube-home pvc`): named as agent-sandbox
 * names the claim of a Sandbox's volumeClaimTemplate `abx-home`, so both modes share it.
 */
export function homeClaimName(id: string): string {
  return `${HOME_VOLUME}-${podName(id)}`;
}

/** The PersistentVolumeClaim of volume `id` (`vol_…`): `abx-vol-…`. */
export function volumeClaimName(id: string): string {
  return `abx-${id.toLowerCase().replace(/_/g, '-')}`;
}

/** The Secret holding sandbox `id`'s envd tokens. */
export function secretName(id: string): string {
  return `abx-${id}-token`;
}

/** What the pod of a sandbox is made with, beyond the spec. */
export interface PodContext {
  namespace: string;
  /** The image holding the portable runtime at /opt/abx (the init container's). */
  runtimeImage: string;
  /** The image of templates without one. */
  baseImage: string;
  /** The daemon's sandboxes folder (`dirname(spec.dir)`), hashed into a label. */
  sandboxesDir: string;
  /** Pull policy of both images; default IfNotPresent. */
  imagePullPolicy?: 'Always' | 'IfNotPresent' | 'Never';
  /**
   * The PersistentVolumeClaim the sandbox's home and /tmp live on (`--kube-home pvc`: a hibernate
   * deletes the pod and keeps it); none: an emptyDir home, gone with the pod.
   */
  homeClaim?: string;
}

/**
 * The pod volumes and the main container's mounts of the sandbox's abx volumes: one
 * PersistentVolumeClaim each ({@link volumeClaimName}), read-only where the mount says so (the
 * claim's volume and the mount both).
 */
export function volumeMountsOf(mounts: readonly VolumeMountSpec[] = []) {
  return {
    volumes: mounts.map((mount, index) => ({
      name: `abx-vol-${index}`,
      persistentVolumeClaim: {
        claimName: volumeClaimName(mount.volume.id),
        ...(mount.readOnly ? { readOnly: true } : {}),
      },
    })),
    mounts: mounts.map((mount, index) => ({
      name: `abx-vol-${index}`,
      mountPath: mount.path,
      ...(mount.readOnly ? { readOnly: true } : {}),
    })),
  };
}

/** Kubernetes quantities: bytes as a plain integer, CPU in millicores. */
function bytes(value: number): string {
  return String(Math.round(value));
}
function millicores(cores: number): string {
  return `${Math.max(1, Math.round(cores * 1000))}m`;
}

const SECURITY = {
  runAsUser: SANDBOX_UID,
  runAsGroup: SANDBOX_UID,
  runAsNonRoot: true,
  allowPrivilegeEscalation: false,
  privileged: false,
  capabilities: { drop: ['ALL'] },
  seccompProfile: { type: 'RuntimeDefault' },
};

/**
 * The pod of one sandbox. The image's file system, envd on the portable runtime (copied by an
 * init container from the runtime image into an emptyDir mounted read-only at /opt/abx, so the
 * image needs neither Node nor glibc), envd listening on the pod's address at {@link ENVD_PORT}
 * with the token the init container copied from the sandbox's Secret. uid/gid 1000, no
 * capabilities, no privilege escalation, the runtime's default seccomp profile, no service
 * account token, never restarted (a sandbox that ends is gone). `resources` become requests and
 * limits (cpu, memory, ephemeral-storage for the disk); the template's `kubernetes:` section adds
 * its runtime class (gVisor, Kata), node selector and tolerations. The home is an emptyDir (a
 * template without an image), the image's own, or with `context.homeClaim` a claim's `home`
 * folder (its `tmp` one at /tmp), seeded from the image's home on its first start; abx volumes
 * are claims mounted at their paths ({@link volumeMountsOf}).
 */
export function sandboxPod(spec: SandboxSpec, context: PodContext): V1Pod {
  if (spec.user === 'root') {
    throw new InvalidArgumentError(
      `sandbox ${spec.id}: the kubernetes provider runs sandboxes as uid ${SANDBOX_UID} only; image templates are built on the docker provider (abx daemon start --provider docker), then pushed to a registry the cluster pulls from`,
    );
  }
  const user = spec.user ?? 'user';
  const home = `/home/${user}`;
  const { resources } = spec;
  const quantities: Record<string, string> = {};
  if (resources.cpu) quantities.cpu = millicores(resources.cpu);
  if (resources.memory) quantities.memory = bytes(resources.memory);
  if (resources.disk) quantities['ephemeral-storage'] = bytes(resources.disk);
  const pull = context.imagePullPolicy ?? 'IfNotPresent';
  const kube = spec.kubernetes ?? {};
  const env = {
    PATH: `${BASE_PATH}:${SANDBOX_RUNTIME_DIR}/bin`,
    HOME: home,
    USER: user,
    LANG: 'C.UTF-8',
    ...spec.env,
    ABX_SANDBOX_ID: spec.id,
  };
  // A template without an image runs on the base image, which has no home for the user.
  const ownHome = !spec.image;
  const claim = context.homeClaim;
  const userVolumes = volumeMountsOf(spec.volumeMounts);
  // Where the home is: an emptyDir at /home (the base image's), the image's own, or a claim.
  const homeMounts = claim
    ? [
        { name: HOME_VOLUME, mountPath: home, subPath: HOME_SUBPATH },
        { name: HOME_VOLUME, mountPath: '/tmp', subPath: TMP_SUBPATH },
      ]
    : ownHome
      ? [{ name: HOME_VOLUME, mountPath: '/home' }]
      : [];
  const initResources = {
    requests: { cpu: '50m', memory: '64Mi' },
    limits: { cpu: '1', memory: '256Mi' },
  };
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: podName(spec.id),
      namespace: context.namespace,
      labels: {
        [MANAGED_BY_LABEL]: MANAGED_BY,
        [SANDBOX_ID_LABEL]: spec.id,
        [SANDBOXES_LABEL]: sandboxesHash(context.sandboxesDir),
        [NETWORK_LABEL]: spec.network,
      },
      ...(spec.template ? { annotations: { [TEMPLATE_ANNOTATION]: spec.template } } : {}),
    },
    spec: {
      hostname: spec.id.slice(0, 63),
      restartPolicy: 'Never',
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      terminationGracePeriodSeconds: 1,
      securityContext: {
        runAsUser: SANDBOX_UID,
        runAsGroup: SANDBOX_UID,
        runAsNonRoot: true,
        // Volumes (claims) are the user's group's, writable by uid 1000; their ownership is
        // changed only when their root's is not that already (a big volume wakes fast).
        fsGroup: SANDBOX_UID,
        fsGroupChangePolicy: 'OnRootMismatch',
        seccompProfile: { type: 'RuntimeDefault' },
      },
      ...(kube.runtimeClassName ? { runtimeClassName: kube.runtimeClassName } : {}),
      ...(kube.nodeSelector ? { nodeSelector: kube.nodeSelector } : {}),
      ...(kube.tolerations ? { tolerations: kube.tolerations } : {}),
      initContainers: [
        {
          name: RUNTIME_CONTAINER,
          image: context.runtimeImage,
          imagePullPolicy: pull,
          command: [SANDBOX_NODE, '-e', initScript(ownHome ? user : undefined, Boolean(claim))],
          securityContext: { ...SECURITY, readOnlyRootFilesystem: true },
          resources: initResources,
          volumeMounts: [
            { name: 'abx-runtime', mountPath: INIT_RUNTIME_DIR },
            { name: 'abx-run', mountPath: INIT_RUN_DIR },
            { name: 'abx-token', mountPath: INIT_TOKEN_DIR, readOnly: true },
            ...(ownHome || claim ? [{ name: HOME_VOLUME, mountPath: INIT_HOME_DIR }] : []),
          ],
        },
        // An image's home onto a new home claim: in the image itself, with the runtime's node.
        ...(claim && spec.image
          ? [
              {
                name: SEED_CONTAINER,
                image: spec.image,
                imagePullPolicy: pull,
                command: [SANDBOX_NODE, '-e', seedScript(home)],
                securityContext: { ...SECURITY, readOnlyRootFilesystem: true },
                resources: initResources,
                volumeMounts: [
                  { name: 'abx-runtime', mountPath: SANDBOX_RUNTIME_DIR, readOnly: true },
                  { name: HOME_VOLUME, mountPath: INIT_HOME_DIR },
                ],
              },
            ]
          : []),
      ],
      containers: [
        {
          name: SANDBOX_CONTAINER,
          image: spec.image ?? context.baseImage,
          imagePullPolicy: pull,
          command: [SANDBOX_NODE],
          args: [
            ...ENVD_NODE_OPTIONS,
            `${SANDBOX_RUNTIME_DIR}/envd.cjs`,
            // $(ABX_POD_IP) is expanded by the kubelet from the env below (downward API).
            '--listen',
            `$(ABX_POD_IP):${ENVD_PORT}`,
            '--ports-host',
            '$(ABX_POD_IP)',
            '--socket',
            `${SANDBOX_RUN_DIR}/envd.sock`,
            '--ports-dir',
            `${SANDBOX_RUN_DIR}/ports`,
            '--token-file',
            POD_TOKEN_FILE,
            ...(spec.capabilities ? ['--capabilities', spec.capabilities.join(',')] : []),
            ...(spec.template ? ['--template', spec.template] : []),
          ],
          workingDir: spec.workdir,
          env: [
            { name: POD_IP_ENV, valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
            // The pod's own address is never a create's (nor a woken sandbox's old one, which its
            // environment as envd had it holds): the last of two names would win.
            ...Object.entries(env)
              .filter(([name]) => name !== POD_IP_ENV)
              .map(([name, value]) => ({ name, value })),
          ],
          ports: [{ name: 'envd', containerPort: ENVD_PORT, protocol: 'TCP' }],
          readinessProbe: {
            httpGet: { path: '/health', port: ENVD_PORT },
            periodSeconds: 1,
            failureThreshold: 1,
          },
          ...(Object.keys(quantities).length > 0
            ? { resources: { requests: { ...quantities }, limits: { ...quantities } } }
            : {}),
          securityContext: SECURITY,
          volumeMounts: [
            { name: 'abx-runtime', mountPath: SANDBOX_RUNTIME_DIR, readOnly: true },
            { name: 'abx-run', mountPath: SANDBOX_RUN_DIR },
            ...homeMounts,
            ...userVolumes.mounts,
          ],
        },
      ],
      volumes: [
        { name: 'abx-runtime', emptyDir: {} },
        { name: 'abx-run', emptyDir: { medium: 'Memory', sizeLimit: RUN_DIR_SIZE } },
        { name: 'abx-token', secret: { secretName: secretName(spec.id), defaultMode: 0o440 } },
        ...(claim
          ? [{ name: HOME_VOLUME, persistentVolumeClaim: { claimName: claim } }]
          : ownHome
            ? [
                {
                  name: HOME_VOLUME,
                  emptyDir: resources.disk ? { sizeLimit: bytes(resources.disk) } : {},
                },
              ]
            : []),
        ...userVolumes.volumes,
      ],
    },
  };
}

/**
 * The Secret with envd's token file (the access token, and the control plane's on a second
 * line), owned by the pod (or its Sandbox) so that the cluster's garbage collector removes it with the pod even
 * when the provider cannot.
 */
export function tokenSecret(
  spec: SandboxSpec,
  namespace: string,
  owner: { name: string; uid: string; kind?: 'Pod' | 'Sandbox' },
  token: string,
): V1Secret {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name: secretName(spec.id),
      namespace,
      labels: { [MANAGED_BY_LABEL]: MANAGED_BY, [SANDBOX_ID_LABEL]: spec.id },
      ownerReferences: [
        {
          apiVersion: owner.kind === 'Sandbox' ? 'agents.x-k8s.io/v1beta1' : 'v1',
          kind: owner.kind ?? 'Pod',
          name: owner.name,
          uid: owner.uid,
          blockOwnerDeletion: true,
        },
      ],
    },
    type: 'Opaque',
    data: { [TOKEN_KEY]: Buffer.from(token).toString('base64') },
  };
}
