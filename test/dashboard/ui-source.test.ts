import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, test } from 'vitest';
import { ROOT } from '../helpers/build.js';

// The dashboard's rules that show in its source (docs/dashboard.md, Security): text only ever
// becomes text, nothing is evaluated, nothing is framed, downloads are octet-stream blobs. The
// browser test (dashboard.test.ts) checks the same rules on the running page.

const SRC = join(ROOT, 'ui', 'src');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? files(path) : [path];
  });
}

/** Each file of ui/src with the lines that match `pattern`. */
function matches(pattern: RegExp): string[] {
  const found: string[] = [];
  for (const file of files(SRC)) {
    readFileSync(file, 'utf8')
      .split('\n')
      .forEach((line, index) => {
        if (pattern.test(line)) found.push(`${relative(ROOT, file)}:${index + 1}: ${line.trim()}`);
      });
  }
  return found;
}

describe('the dashboard’s source', () => {
  test('never turns a string into HTML or code', () => {
    expect(
      matches(
        /innerHTML|outerHTML|insertAdjacentHTML|dangerouslySetInnerHTML|document\.write|\beval\s*\(|new Function\b|DOMParser|createContextualFragment|srcdoc/,
      ),
    ).toEqual([]);
  });

  test('frames nothing and opens no window', () => {
    expect(matches(/<iframe|<frame|<embed|<object|window\.open\s*\(|target="_blank"/)).toEqual([]);
  });

  test('makes every downloaded blob application/octet-stream, and stores nothing scripts could read later', () => {
    // The only Blob saved through <a download> is typed octet-stream; the other Blob is an image
    // shown with <img src=blob:>.
    expect(matches(/new Blob\(/).map((line) => line.replace(/^[^:]+:\d+: /, ''))).toEqual([
      expect.stringContaining("type: 'application/octet-stream'"),
      expect.stringContaining('type: imageType'),
    ]);
    expect(matches(/localStorage|sessionStorage|indexedDB|document\.cookie/)).toEqual([]);
  });

  test.skipIf(!existsSync(join(ROOT, 'dist', 'ui', 'index.html')))(
    'is built into dist/ui with no inline script (the CSP allows none)',
    () => {
      const html = readFileSync(join(ROOT, 'dist', 'ui', 'index.html'), 'utf8');
      const scripts = [...html.matchAll(/<script\b([^>]*)>([\s\S]*?)<\/script>/g)];
      expect(scripts.length).toBeGreaterThan(0);
      for (const [, attributes, body] of scripts) {
        expect(attributes).toMatch(/\bsrc="\/assets\/[^"]+\.js"/);
        expect(body?.trim()).toBe('');
      }
      expect(html).not.toMatch(/\son[a-z]+=/i);
    },
  );
});
