// Builds envd's front (native/envd-front, Rust with std only) into dist/runtime/envd-front: a
// static program for this machine's architecture, which the runtime carries into sandboxes.
// Without cargo it is left out with a warning, and envd sleeps under the shell loop as before
// (docs/providers.md, "envd's front").
import { spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';

const crate = 'native/envd-front';
const out = 'dist/runtime/envd-front';
const cargo = spawnSync('cargo', ['--version'], { encoding: 'utf8' });
if (cargo.status !== 0) {
  console.warn(
    `build-front: cargo is not installed, so ${out} is left out (sandboxes run envd under the shell loop); install Rust (rustup.rs) to build it`,
  );
  process.exit(0);
}
const rustc = spawnSync('rustc', ['-vV'], { encoding: 'utf8' });
const host = /^host: (\S+)$/m.exec(rustc.stdout ?? '')?.[1];
if (!host) {
  console.error(`build-front: rustc -vV did not name the host: ${rustc.stderr || rustc.stdout}`);
  process.exit(1);
}
// Static (crt-static), so it runs in any image: glibc, musl or none.
const built = spawnSync(
  'cargo',
  ['build', '--release', '--offline', '--locked', '--quiet', '--target', host],
  {
    cwd: crate,
    stdio: 'inherit',
    env: { ...process.env, RUSTFLAGS: '-C target-feature=+crt-static' },
  },
);
if (built.status !== 0) {
  console.error(`build-front: cargo build of ${crate} failed (exit ${built.status})`);
  process.exit(1);
}
const binary = join(crate, 'target', host, 'release', 'envd-front');
if (!existsSync(binary)) {
  console.error(`build-front: cargo built no ${binary}`);
  process.exit(1);
}
copyFileSync(binary, out);
chmodSync(out, 0o755);
