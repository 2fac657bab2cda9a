import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect } from 'vitest';
import {
  InvalidArgumentError,
  NotFoundError,
  SandboxError,
  SandboxStartError,
} from '../../src/errors.js';
import { type Plane, test } from './plane.js';

function writeTemplate(plane: Plane, name: string, text: string): string {
  const file = join(plane.dir, `${name}.yaml`);
  writeFileSync(file, text);
  return file;
}

describe('TemplateService on a memory provider', () => {
  test('a template without setup is recorded without starting a sandbox', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const built = await plane.templates.build(
      writeTemplate(plane, 'plain', 'name: plain\nenv: { A: "1" }\ntimeout: 2m\n'),
    );
    expect(built.homeDir).toBeUndefined();
    expect(built.spec).toMatchObject({ name: 'plain', env: { A: '1' }, timeoutMs: 120_000 });
    expect(plane.provider.creates).toBe(0);
    expect((await plane.templates.list()).map((t) => t.spec.name)).toEqual(['base', 'plain']);

    // Its sandboxes get its env and lifetime.
    const { record } = await plane.sandboxes.create({ template: 'plain', envs: { B: '2' } });
    expect(record.expiresAt - record.createdAt).toBe(120_000);
    expect(plane.provider.sandbox(record.id).spec.env).toEqual({ A: '1', B: '2' });
    expect(plane.provider.sandbox(record.id).spec.baseHome).toBeUndefined();
  });

  test('setup runs once in a build sandbox; the exported home seeds each sandbox', async ({
    open,
  }) => {
    const plane = open({ warmPool: 0 });
    const built = await plane.templates.build(
      writeTemplate(
        plane,
        'tools',
        'name: tools\nsetup:\n  - echo one > a.txt\n  - echo two > b.txt\n  - echo done\n',
      ),
    );
    const home = join(plane.templatesDir, 'tools', 'home');
    expect(built.homeDir).toBe(home);
    expect(readFileSync(join(home, 'a.txt'), 'utf8')).toBe('one\n');
    expect(readFileSync(join(home, 'b.txt'), 'utf8')).toBe('two\n');
    const builder = plane.provider.sandbox('build-tools');
    expect(builder.execs).toEqual(['echo one > a.txt', 'echo two > b.txt', 'echo done']);
    expect(builder.alive).toBe(false);
    // Nothing of the build is left but the template's home.
    expect(readdirSync(plane.templatesDir)).toEqual(['tools']);
    expect(readdirSync(join(plane.templatesDir, 'tools'))).toEqual(['home']);

    const a = (await plane.sandboxes.create({ template: 'tools' })).record;
    const b = (await plane.sandboxes.create({ template: 'tools' })).record;
    for (const id of [a.id, b.id]) {
      const box = plane.provider.sandbox(id);
      expect(box.spec.baseHome).toBe(home);
      expect(readFileSync(join(box.home, 'a.txt'), 'utf8')).toBe('one\n');
      expect(box.execs).toEqual([]);
    }
  });

  test('a failing setup step fails the build with its output; nothing is recorded', async ({
    open,
  }) => {
    const plane = open({ warmPool: 0 });
    const file = writeTemplate(plane, 'broken', 'name: broken\nsetup:\n  - exit 3\n  - echo no\n');
    const attempt = plane.templates.build(file);
    await expect(attempt).rejects.toThrow(SandboxError);
    await expect(plane.templates.build(file)).rejects.toThrow(
      "template 'broken': setup[0] `exit 3` exited with code 3",
    );
    expect(plane.provider.sandbox('build-broken').execs).toEqual(['exit 3']);
    expect(plane.provider.aliveIds()).toEqual([]);
    await expect(plane.templates.get('broken')).rejects.toThrow(NotFoundError);
    expect(readdirSync(plane.templatesDir)).toEqual([]);
  });

  test('a failed rebuild keeps the previous build', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const file = writeTemplate(plane, 'kept', 'name: kept\nsetup:\n  - echo v1 > v.txt\n');
    const first = await plane.templates.build(file);
    writeFileSync(file, 'name: kept\nsetup:\n  - echo v2 > v.txt\n  - exit 1\n');
    await expect(plane.templates.build(file)).rejects.toThrow('exited with code 1');
    expect((await plane.templates.get('kept')).builtAt).toBe(first.builtAt);
    expect(readFileSync(join(plane.templatesDir, 'kept', 'home', 'v.txt'), 'utf8')).toBe('v1\n');
  });

  test('bad templates are InvalidArgumentErrors; base cannot be rebuilt or removed', async ({
    open,
  }) => {
    const plane = open({ warmPool: 0 });
    await expect(plane.templates.build(join(plane.dir, 'missing.yaml'))).rejects.toThrow(
      InvalidArgumentError,
    );
    await expect(
      plane.templates.build(writeTemplate(plane, 'typo', 'name: typo\nsetpu: []\n')),
    ).rejects.toThrow(InvalidArgumentError);
    await expect(
      plane.templates.build(writeTemplate(plane, 'base', 'name: base\n')),
    ).rejects.toThrow("'base' is built in; give your template another name");
    await expect(plane.templates.remove('base')).rejects.toThrow(InvalidArgumentError);
    await expect(plane.templates.remove('nope')).rejects.toThrow(NotFoundError);
    expect(plane.provider.creates).toBe(0);
  });

  test('remove forgets a template and its home', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    await plane.templates.build(writeTemplate(plane, 'gone', 'name: gone\nsetup:\n  - echo ok\n'));
    expect(existsSync(join(plane.templatesDir, 'gone', 'home'))).toBe(true);
    await plane.templates.remove('gone');
    expect(existsSync(join(plane.templatesDir, 'gone'))).toBe(false);
    await expect(plane.sandboxes.create({ template: 'gone' })).rejects.toThrow(NotFoundError);
  });

  // Regression, fixed (src/control/template-service.ts, runSetup): the build's work folder
  // (`templates/{name}.build-{id}`) is created before provider.create, outside the try that
  // removes it, so a build sandbox that fails to start leaves the folder behind for good.
  test('a build whose sandbox fails to start leaves no folder behind', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    plane.provider.failNextCreate(new SandboxStartError('sandbox did not start: no room'));
    const file = writeTemplate(plane, 'nostart', 'name: nostart\nsetup:\n  - echo ok\n');
    await expect(plane.templates.build(file)).rejects.toThrow('no room');
    expect(readdirSync(plane.templatesDir)).toEqual([]);
  });
});
