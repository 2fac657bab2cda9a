#!/usr/bin/env bash
# deepagents' own sandbox standard tests (libs/standard-tests of langchain-ai/deepagentsjs, the
# package @langchain/sandbox-standard-tests), run against deepAgentsBackend(sandbox) on real abx
# sandboxes. The tests are copied from a copy of that repository fetched beforehand (never
# committed here, and this script fetches nothing), and run with this project's vitest and its
# `deepagents` devDependency against a private daemon.
#
#   scripts/deepagents-standard-tests.sh DEEPAGENTSJS_CHECKOUT [vitest arguments…]
#
# DEEPAGENTSJS_CHECKOUT: a checkout (or `git archive`) of langchain-ai/deepagentsjs, or its
# libs/standard-tests folder itself.
# Environment:
#   ABX_STD_OPTIONS  deepAgentsBackend's options as JSON (default `{}`: real paths), e.g. '{"root":"/"}'
#   ABX_STD_PATHS    where the tests put their files: `tmp` (default, `/tmp/abx-std/NAME`, as
#                    deepagents' other providers) or `relative` (`NAME`, in the working directory)
#   ABX_STD_TEMPLATE the sandboxes' template (default `base`)
#
# The summary is in .deepagents-standard/summary.txt, the JSON report beside it; exit 0 only when
# every test passed.
set -euo pipefail

checkout=${1:?usage: scripts/deepagents-standard-tests.sh DEEPAGENTSJS_CHECKOUT [vitest args]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
src="$checkout/libs/standard-tests/src"
[[ -d $src ]] || src="$checkout/src"
[[ -f $src/vitest.ts && -f $src/sandbox.ts ]] || {
  echo "no libs/standard-tests/src/vitest.ts under $checkout: give the path of a copy of langchain-ai/deepagentsjs" >&2
  exit 2
}
[[ -f $root/dist/index.js ]] || { echo "build first: npm run build" >&2; exit 2; }

# Inside the project (git-ignored), so that `deepagents` and vitest resolve from its node_modules.
work="$root/.deepagents-standard"
rm -rf "$work"
mkdir -p "$work/home"
cp -r "$src" "$work/standard-tests"
export ABX_HOME="$work/home"
export ABX_STD_OPTIONS="${ABX_STD_OPTIONS:-{\}}"
export ABX_STD_PATHS="${ABX_STD_PATHS:-tmp}"
export ABX_STD_TEMPLATE="${ABX_STD_TEMPLATE:-base}"
abx() { node "$root/dist/cli.js" "$@"; }

# The sandboxes' egress leaves from a network namespace of this run's own with only its loopback
# (as the project's own tests do as root): nothing here needs more.
egress_ns=""
if [[ $(id -u) == 0 ]] && ip -V >/dev/null 2>&1; then
  egress_ns="abx-std-egress-$$"
  ip netns add "$egress_ns"
  ip -n "$egress_ns" link set lo up
  export ABX_EGRESS_NETNS="/run/netns/$egress_ns"
fi

cleanup() {
  abx kill --all >/dev/null 2>&1 || true
  abx daemon stop >/dev/null 2>&1 || true
  [[ -z $egress_ns ]] || ip netns delete "$egress_ns" 2>/dev/null || true
}
trap cleanup EXIT

cat >"$work/abx.standard.test.ts" <<EOF
import { sandboxStandardTests } from './standard-tests/vitest.js';
import { deepAgentsBackend, Sandbox } from '$root/dist/index.js';

const options = JSON.parse(process.env.ABX_STD_OPTIONS ?? '{}');
const template = process.env.ABX_STD_TEMPLATE ?? 'base';
const home = process.env.ABX_HOME;

/** A sandbox as the standard tests want it: deepagents' protocol, isRunning and close. */
class AbxStandardSandbox {
  private running = true;
  private readonly backend: ReturnType<typeof deepAgentsBackend>;
  constructor(readonly sandbox: Sandbox) {
    this.backend = deepAgentsBackend(sandbox, options);
  }
  get id() { return this.backend.id; }
  get isRunning() { return this.running; }
  async close() {
    this.running = false;
    await this.sandbox.kill();
  }
  execute(command: string) { return this.backend.execute(command); }
  uploadFiles(files: [string, Uint8Array][]) { return this.backend.uploadFiles(files); }
  downloadFiles(paths: string[]) { return this.backend.downloadFiles(paths); }
  ls(path: string) { return this.backend.ls(path); }
  read(path: string, offset?: number, limit?: number) { return this.backend.read(path, offset, limit); }
  readRaw(path: string) { return this.backend.readRaw(path); }
  write(path: string, content: string) { return this.backend.write(path, content); }
  edit(path: string, a: string, b: string, all?: boolean) { return this.backend.edit(path, a, b, all); }
  delete(path: string) { return this.backend.delete(path); }
  grep(pattern: string, path?: string | null, glob?: string | null, max?: number | null) {
    return this.backend.grep(pattern, path, glob, max);
  }
  glob(pattern: string, path?: string) { return this.backend.glob(pattern, path); }
}

sandboxStandardTests({
  name: \`abx deepAgentsBackend(\${JSON.stringify(options)}) on \${template}\`,
  sequential: true,
  timeout: 120_000,
  createSandbox: async (opts) => {
    const sandbox = await Sandbox.create({ template, home });
    const wrapped = new AbxStandardSandbox(sandbox);
    const files = Object.entries(opts?.initialFiles ?? {});
    if (files.length > 0) {
      const answers = await wrapped.uploadFiles(
        files.map(([path, text]) => [path, new TextEncoder().encode(text)]),
      );
      const failed = answers.filter((a) => a.error);
      if (failed.length > 0) throw new Error(\`initial files: \${JSON.stringify(failed)}\`);
    }
    return wrapped;
  },
  closeSandbox: (sandbox) => sandbox.close(),
  resolvePath: (name) => (process.env.ABX_STD_PATHS === 'relative' ? name : \`/tmp/abx-std/\${name}\`),
});
EOF

cat >"$work/vitest.config.mts" <<'EOF'
import { defineConfig } from 'vitest/config';
export default defineConfig({
  test: { testTimeout: 120_000, hookTimeout: 120_000, fileParallelism: false, environment: 'node' },
});
EOF

echo "deepAgentsBackend options: $ABX_STD_OPTIONS; files under: $ABX_STD_PATHS; template: $ABX_STD_TEMPLATE" >&2
cd "$work"
status=0
npx vitest run --root "$work" --config "$work/vitest.config.mts" --reporter=default \
  --reporter=json --outputFile.json="$work/report.json" abx.standard.test.ts "$@" \
  >"$work/output.txt" 2>&1 || status=$?
if [[ ! -f $work/report.json ]]; then
  tail -n 40 "$work/output.txt" >&2
  exit 1
fi
node -e '
const r = require(process.argv[1]);
const lines = [];
for (const file of r.testResults) {
  for (const t of file.assertionResults) {
    if (t.status === "failed") lines.push(`FAIL ${t.fullName}: ${(t.failureMessages[0] ?? "").split("\n")[0].slice(0, 300)}`);
  }
  if (file.assertionResults.length === 0 && file.message) lines.push(`ERROR ${file.message.split("\n")[0]}`);
}
lines.push(`standard tests: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped, of ${r.numTotalTests}`);
console.log(lines.join("\n"));
' "$work/report.json" | tee "$work/summary.txt"
exit $status
