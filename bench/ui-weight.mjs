// The dashboard's page weight: what the first load of the sandboxes page fetches from dist/ui
// (index.html's scripts and styles and the modules they import statically), gzip-compressed as
// the daemon serves it, against the goal of at most 300 KiB of JavaScript; and the chunks loaded
// later (the terminal, the charts). `npm run build` first; `npm run bench:ui` prints it.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';

const dir = fileURLToPath(new URL('../dist/ui', import.meta.url));
if (!existsSync(join(dir, 'index.html'))) {
  console.error(`${dir}/index.html is missing: run npm run build first`);
  process.exit(1);
}
const GOAL_KIB = 300;
const html = readFileSync(join(dir, 'index.html'), 'utf8');
const first = new Set();
const queue = [...html.matchAll(/(?:src|href)="\/(assets\/[^"]+\.(?:js|css))"/g)].map((m) => m[1]);
while (queue.length > 0) {
  const file = queue.shift();
  if (first.has(file)) continue;
  first.add(file);
  if (!file.endsWith('.js')) continue;
  // Static imports only (`import … from "./x.js"`); `import("./x.js")` loads later.
  const code = readFileSync(join(dir, file), 'utf8');
  for (const m of code.matchAll(
    /\bimport\s*(?:[\w$*{}\s,]+\s*from\s*)?["'`]\.\/([^"'`]+\.js)["'`]/g,
  )) {
    queue.push(`assets/${m[1]}`);
  }
}
const sizes = (file) => {
  const body = readFileSync(join(dir, file));
  return { file, raw: body.length, gzip: gzipSync(body).length };
};
const kib = (n) => `${(n / 1024).toFixed(1)} KiB`;
const loaded = [...first].map(sizes);
const later = readdirSync(join(dir, 'assets'))
  .map((name) => `assets/${name}`)
  .filter((file) => !first.has(file))
  .map(sizes);
const total = (list, ext) =>
  list.filter((s) => s.file.endsWith(ext)).reduce((sum, s) => sum + s.gzip, 0);
console.log('| file | loaded | raw | gzip |');
console.log('| --- | --- | --- | --- |');
for (const s of loaded) console.log(`| ${s.file} | first load | ${kib(s.raw)} | ${kib(s.gzip)} |`);
for (const s of later) console.log(`| ${s.file} | on demand | ${kib(s.raw)} | ${kib(s.gzip)} |`);
const js = total(loaded, '.js');
console.log(
  `\nFirst load of the sandboxes page: ${kib(js)} of JavaScript and ${kib(total(loaded, '.css'))} of CSS, gzip (goal: JavaScript ≤ ${GOAL_KIB} KiB: ${js <= GOAL_KIB * 1024 ? 'met' : 'NOT met'}); ${kib(total(later, '.js'))} of JavaScript more on demand.`,
);
