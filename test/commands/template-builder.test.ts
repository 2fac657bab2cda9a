import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { parseTemplate, Template, TemplateError } from '../../src/index.js';

const dir = mkdtempSync(join(tmpdir(), 'abx-builder-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A spec without where it was read from, to compare a YAML file's with a builder's. */
function specOf(yaml: string, file: string) {
  const { places: _places, path: _path, ...spec } = parseTemplate(yaml, file);
  return spec;
}

describe('Template (code) and template.yaml give one spec', () => {
  test('an image template with root steps, a copy, env, workdir, user and limits', () => {
    const file = join(dir, 'template.yaml');
    const yaml = `name: data-tools
description: pandas and jq
image: python:3.12-slim
user: analyst
capabilities: [shell, files, code]
env: { MODE: batch, LEVEL: "2" }
workdir: /home/analyst
timeout: 10m
resources: { memory: 512M, cpu: 1, open_files: 256 }
network: host
runtime: { node: 24 }
setup:
  - apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends 'jq' && rm -rf /var/lib/apt/lists/*
  - PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir 'pandas' 'numpy==2.1.0'
  - { copy: ./data, to: /home/analyst/data, user: analyst }
  - { run: make -C /home/analyst/data, user: analyst }
`;
    writeFileSync(file, yaml);
    const code = Template.fromImage('python:3.12-slim')
      .setDescription('pandas and jq')
      .setUser('analyst')
      .setCapabilities(['shell', 'files', 'code'])
      .setEnvs({ MODE: 'batch' })
      .setEnvs({ LEVEL: '2' })
      .setWorkdir('/home/analyst')
      .setTimeout('10m')
      .setResources({ memory: '512M', cpu: 1, openFiles: 256 })
      .setNetwork('host')
      .requireNode(24)
      .aptInstall(['jq'])
      .pipInstall(['pandas', 'numpy==2.1.0'])
      .copy(join(dir, 'data'), '/home/analyst/data', { user: 'analyst' })
      .runCmd('make -C /home/analyst/data', { user: 'analyst' });
    const fromCode = specOf(code.toYaml('data-tools'), 'code');
    expect(fromCode).toEqual(specOf(yaml, file));
    // What the model made of it: root runs the image's steps unless a step names a user.
    expect(fromCode.setup.map((s) => s.user)).toEqual(['root', 'root', 'analyst', 'analyst']);
    expect(fromCode.setup[2]).toEqual({
      copy: join(dir, 'data'),
      to: '/home/analyst/data',
      user: 'analyst',
    });
    expect([fromCode.image, fromCode.user, fromCode.timeoutMs, fromCode.runtime]).toEqual([
      'python:3.12-slim',
      'analyst',
      600_000,
      { node: 24 },
    ]);
  });

  test('a Dockerfile path is absolute in the spec, relative to the file in YAML', () => {
    const yaml = 'name: df\ndockerfile: images/Dockerfile\n';
    expect(specOf(yaml, join(dir, 'template.yaml')).dockerfile).toBe(
      join(dir, 'images', 'Dockerfile'),
    );
    expect(
      specOf(Template.fromDockerfile(join(dir, 'images/Dockerfile')).toYaml('df'), 'x'),
    ).toEqual(specOf(yaml, join(dir, 'template.yaml')));
  });

  test('package names with shell syntax stay single words', () => {
    const [step] = specOf(
      Template.fromImage('debian:12').aptInstall("a; rm -rf / #'").toYaml('t'),
      'x',
    ).setup as unknown as [{ run: string }];
    expect(step.run).toContain(`'a; rm -rf / #'\\''`);
  });

  test('the builder is immutable: a base extends two ways', () => {
    const base = Template.fromImage('debian:12').runCmd('echo base');
    const one = base.runCmd('echo one');
    const two = base.runCmd('echo two');
    const runs = (t: Template) =>
      (specOf(t.toYaml('t'), 'x').setup as { run: string }[]).map((s) => s.run);
    expect(runs(base)).toEqual(['echo base']);
    expect(runs(one)).toEqual(['echo base', 'echo one']);
    expect(runs(two)).toEqual(['echo base', 'echo two']);
  });
});

describe('what a template without an image cannot do', () => {
  test.each([
    [
      'a root step',
      'name: t\nsetup:\n  - { run: apt-get install jq, user: root }\n',
      'setup[0].user: steps run as user unless',
    ],
    ['another user', 'name: t\nuser: analyst\n', 'user: only an image template'],
    [
      'a copy outside the home',
      'name: t\nsetup:\n  - { copy: ., to: /opt/x }\n',
      'must be under /home/user',
    ],
    ['image and dockerfile', 'name: t\nimage: a\ndockerfile: b\n', 'not both'],
    ['a bad image reference', 'name: t\nimage: "no spaces allowed"\n', 'image reference'],
    [
      'a step with run and copy',
      'name: t\nimage: a\nsetup:\n  - { run: x, copy: y, to: /z }\n',
      'either run',
    ],
    ['an unknown step key', 'name: t\nimage: a\nsetup:\n  - { run: x, as: root }\n', 'as'],
  ])('%s is refused with its location', (_, yaml, message) => {
    expect(() => parseTemplate(yaml, 't.yaml')).toThrow(TemplateError);
    expect(() => parseTemplate(yaml, 't.yaml')).toThrow(message);
  });

  test('plain string steps still work, run as the sandbox user', () => {
    expect(parseTemplate('name: t\nsetup:\n  - echo hi\n', 't.yaml').setup).toEqual([
      { run: 'echo hi', user: 'user' },
    ]);
  });
});
