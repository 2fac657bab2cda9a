import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { expect } from 'vitest';
import { type Sandbox, Template } from '../../src/index.js';

/**
 * A folder to copy into an image's home and a tiny Python package to `pip install --user` from a
 * local path (no package index is reachable), written under `dir`.
 */
export function homeFixture(dir: string): { data: string; pkg: string } {
  const data = join(dir, 'data');
  mkdirSync(join(data, 'sub'), { recursive: true });
  writeFileSync(join(data, 'notes.txt'), 'seeded data\n');
  writeFileSync(join(data, 'sub', 'deep.txt'), 'deep\n');
  const pkg = join(dir, 'pkg');
  mkdirSync(join(pkg, 'abx_seeded'), { recursive: true });
  writeFileSync(
    join(pkg, 'pyproject.toml'),
    '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n[project]\nname = "abx-seeded"\nversion = "1.0"\n\n[tool.setuptools]\npackages = ["abx_seeded"]\n',
  );
  writeFileSync(
    join(pkg, 'abx_seeded', '__init__.py'),
    'def hello():\n    return "hi from ~/.local"\n',
  );
  return { data, pkg };
}

/**
 * An image template whose build fills the user's home: a copied folder, and a package installed
 * with `pip install --user` as the user (landing in ~/.local).
 */
export function homeTemplate(image: string, dir: string): Template {
  const { data, pkg } = homeFixture(dir);
  return Template.fromImage(image)
    .copy(data, '/home/user/data', { user: 'user' })
    .copy(pkg, '/home/user/src/abx-seeded', { user: 'user' })
    .runCmd(
      'PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --user --no-index --no-build-isolation --no-cache-dir ~/src/abx-seeded',
      { user: 'user' },
    );
}

/** What a sandbox of {@link homeTemplate} must find in its home, owned by its user. */
export async function expectSeededHome(box: Sandbox): Promise<void> {
  expect(await box.files.read('/home/user/data/notes.txt')).toBe('seeded data\n');
  expect(await box.files.read('/home/user/data/sub/deep.txt')).toBe('deep\n');
  const imported = await box.commands.run(
    'cd /tmp && python3 -c "import abx_seeded; print(abx_seeded.hello(), abx_seeded.__file__)"',
  );
  expect(imported.stdout).toMatch(
    /^hi from ~\/\.local \/home\/user\/\.local\/lib\/python3\.\d+\/site-packages\/abx_seeded\/__init__\.py\n$/,
  );
  const owners = await box.commands.run(
    'stat -c %U ~ ~/data ~/data/notes.txt ~/.local/lib; touch ~/data/new && echo writable',
  );
  expect(owners.stdout).toBe('user\nuser\nuser\nuser\nwritable\n');
}
