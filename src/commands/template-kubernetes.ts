import { isRecord, type Path, type TemplateReader } from './template-reader.js';

/** A pod toleration, as Kubernetes takes it (`tolerations[]` of a pod spec). */
export interface TemplateToleration {
  key?: string;
  operator?: 'Equal' | 'Exists';
  value?: string;
  effect?: 'NoSchedule' | 'PreferNoSchedule' | 'NoExecute';
  /** Seconds a NoExecute taint is tolerated (`toleration_seconds` in the template). */
  tolerationSeconds?: number;
}

/** A template's `kubernetes:` section: where and how its pods run on a cluster. */
export interface TemplateKubernetes {
  /** The pod's `runtimeClassName` (`runtime_class`): gVisor (`gvisor`), Kata (`kata`)... */
  runtimeClassName?: string;
  /** The pod's `nodeSelector` (`node_selector`): labels a node must have. */
  nodeSelector?: Record<string, string>;
  tolerations?: TemplateToleration[];
}

const KEYS = ['runtime_class', 'node_selector', 'tolerations'];
const TOLERATION_KEYS = ['key', 'operator', 'value', 'effect', 'toleration_seconds'];
/** A DNS-1123 subdomain: what a RuntimeClass is named with. */
const DNS_SUBDOMAIN =
  /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** A label name: an optional DNS subdomain prefix and `/`, then up to 63 name characters. */
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
/** A label value: empty, or up to 63 name characters. */
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;
const EFFECTS = ['NoSchedule', 'PreferNoSchedule', 'NoExecute'];

/** True when `key` is a Kubernetes label key (`app`, `kubernetes.io/arch`). */
export function isLabelKey(key: string): boolean {
  const slash = key.lastIndexOf('/');
  if (slash < 0) return LABEL_NAME.test(key);
  return DNS_SUBDOMAIN.test(key.slice(0, slash)) && LABEL_NAME.test(key.slice(slash + 1));
}

/** Reads `kubernetes:`, reporting each bad value to `reader` with what Kubernetes accepts. */
export function readKubernetes(
  reader: TemplateReader,
  value: unknown,
): TemplateKubernetes | undefined {
  if (value === undefined || value === null) return undefined;
  const at: Path = ['kubernetes'];
  if (!isRecord(value)) {
    reader.problem(at, `must be a mapping with ${KEYS.join(', ')}`);
    return undefined;
  }
  for (const key of Object.keys(value)) {
    if (!KEYS.includes(key)) reader.problem([...at, key], `unknown key; use ${KEYS.join(', ')}`);
  }
  const section: TemplateKubernetes = {};
  const runtimeClass = value.runtime_class;
  if (runtimeClass !== undefined) {
    if (typeof runtimeClass !== 'string' || !DNS_SUBDOMAIN.test(runtimeClass)) {
      reader.problem(
        [...at, 'runtime_class'],
        'must name a RuntimeClass of the cluster (lower-case letters, digits, - and .), such as gvisor or kata',
      );
    } else section.runtimeClassName = runtimeClass;
  }
  const selector = value.node_selector;
  if (selector !== undefined) {
    if (!isRecord(selector)) {
      reader.problem(
        [...at, 'node_selector'],
        'must be a mapping of node labels, such as kubernetes.io/arch: amd64',
      );
    } else {
      const labels: Record<string, string> = {};
      for (const [key, label] of Object.entries(selector)) {
        if (!isLabelKey(key)) {
          reader.problem(
            [...at, 'node_selector', key],
            'is not a label key ([prefix/]name, name up to 63 letters, digits, -, _ and .)',
          );
        } else if (!['string', 'number', 'boolean'].includes(typeof label)) {
          reader.problem([...at, 'node_selector', key], 'must be a label value (a string)');
        } else if (!LABEL_VALUE.test(String(label))) {
          reader.problem(
            [...at, 'node_selector', key],
            'is not a label value (up to 63 letters, digits, -, _ and ., starting and ending with a letter or digit)',
          );
        } else labels[key] = String(label);
      }
      section.nodeSelector = labels;
    }
  }
  const tolerations = value.tolerations;
  if (tolerations !== undefined) {
    if (!Array.isArray(tolerations)) {
      reader.problem(
        [...at, 'tolerations'],
        'must be a list such as [{ key: sandbox, operator: Exists, effect: NoSchedule }]',
      );
    } else {
      section.tolerations = tolerations.flatMap((entry, index) => {
        const read = readToleration(reader, entry, [...at, 'tolerations', index]);
        return read ? [read] : [];
      });
    }
  }
  return section;
}

function readToleration(
  reader: TemplateReader,
  entry: unknown,
  at: Path,
): TemplateToleration | undefined {
  if (!isRecord(entry)) {
    reader.problem(at, `must be a mapping with ${TOLERATION_KEYS.join(', ')}`);
    return undefined;
  }
  const before = reader.problems.length;
  for (const key of Object.keys(entry)) {
    if (!TOLERATION_KEYS.includes(key)) {
      reader.problem([...at, key], `unknown key; use ${TOLERATION_KEYS.join(', ')}`);
    }
  }
  const toleration: TemplateToleration = {};
  const { key, operator = 'Equal', value, effect } = entry;
  if (key !== undefined) {
    if (typeof key !== 'string' || !isLabelKey(key)) {
      reader.problem([...at, 'key'], 'must be a taint key ([prefix/]name)');
    } else toleration.key = key;
  }
  if (operator !== 'Equal' && operator !== 'Exists') {
    reader.problem([...at, 'operator'], 'must be Equal (the default) or Exists');
  } else {
    toleration.operator = operator;
    if (operator === 'Exists' && value !== undefined) {
      reader.problem([...at, 'value'], 'must be left out with operator Exists');
    }
    if (operator === 'Equal' && key === undefined) {
      reader.problem([...at, 'key'], 'is required unless operator is Exists');
    }
  }
  if (value !== undefined && operator === 'Equal') {
    if (typeof value !== 'string' || !LABEL_VALUE.test(value)) {
      reader.problem([...at, 'value'], 'must be a taint value (up to 63 letters, digits, -, _, .)');
    } else toleration.value = value;
  }
  if (effect !== undefined) {
    if (typeof effect !== 'string' || !EFFECTS.includes(effect)) {
      reader.problem([...at, 'effect'], `must be one of ${EFFECTS.join(', ')}`);
    } else toleration.effect = effect as TemplateToleration['effect'];
  }
  const seconds = entry.toleration_seconds;
  if (seconds !== undefined) {
    if (typeof seconds !== 'number' || !Number.isInteger(seconds) || seconds < 0) {
      reader.problem(
        [...at, 'toleration_seconds'],
        'must be a whole number of seconds (0 or more)',
      );
    } else if (effect !== 'NoExecute') {
      reader.problem([...at, 'toleration_seconds'], 'applies only with effect NoExecute');
    } else toleration.tolerationSeconds = seconds;
  }
  return reader.problems.length === before ? toleration : undefined;
}
