// Lints envd's front (native/envd-front) where cargo is: rustfmt's layout and clippy's warnings,
// as errors. Without cargo there is nothing to lint here (the front is not built either).
import { spawnSync } from 'node:child_process';

const crate = 'native/envd-front';
if (spawnSync('cargo', ['--version']).status !== 0) {
  console.warn('lint-native: cargo is not installed; native/envd-front is not linted');
  process.exit(0);
}
for (const args of [
  ['fmt', '--check'],
  ['clippy', '--offline', '--locked', '--quiet', '--all-targets', '--', '-D', 'warnings'],
]) {
  if (spawnSync('cargo', [args[0], '--version']).status !== 0) {
    console.warn(`lint-native: cargo ${args[0]} is not installed (rustup component add it)`);
    continue;
  }
  const run = spawnSync('cargo', args, { cwd: crate, stdio: 'inherit' });
  if (run.status !== 0) {
    console.error(`lint-native: cargo ${args.join(' ')} failed in ${crate}`);
    process.exit(1);
  }
}
