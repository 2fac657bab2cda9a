#!/usr/bin/env bash
# E2B's own JS SDK tests (packages/js-sdk/tests of e2b-dev/E2B), run against abx: the peer suite of
# docs/e2b.md. The tests are copied from a checkout of E2B (never committed here), their imports of
# E2B's sources pointed at the npm package `e2b` this project has as a devDependency, and run with
# this project's vitest against a private daemon and real sandboxes.
#
#   scripts/e2b-peer-tests.sh E2B_CHECKOUT [url|domain] [vitest arguments…]
#
# url (default): E2B_API_URL = E2B_SANDBOX_URL = the daemon's gateway (one URL).
# domain: a daemon serving TLS with --domain abx.test, E2B_DOMAIN=abx.test:PORT, a throwaway CA in
#   NODE_EXTRA_CA_CERTS and a preload that answers DNS for *.abx.test with 127.0.0.1.
#
# PEER_ROOT_IMAGE=IMAGE (an image on the daemon's Docker engine, a root daemon): E2B's `base`
# becomes an image template of it that allows root (ABX_E2B_BASE_TEMPLATE), as E2B's own `base`
# has root and sudo; without it, `base` is abx's (the host's system, no root).
#
# Only the live tests run: those that create sandboxes and mock nothing (msw and vi.mock suites test
# the SDK itself, not a server). The summary is in $WORK/summary.txt; the JSON report beside it.
set -euo pipefail

checkout=${1:?usage: scripts/e2b-peer-tests.sh E2B_CHECKOUT [url|domain] [vitest args]}
mode=${2:-url}
shift $(($# < 2 ? $# : 2))
root=$(cd "$(dirname "$0")/.." && pwd)
src="$checkout/packages/js-sdk/tests"
[[ -d $src ]] || { echo "no $src: give the path of a checkout of e2b-dev/E2B" >&2; exit 2; }
[[ -f $root/dist/cli.js ]] || { echo "build first: npm run build" >&2; exit 2; }

# Inside the project (git-ignored), so that `e2b` and vitest resolve from its node_modules.
work="$root/.e2b-peer"
rm -rf "$work"
mkdir -p "$work/home"
cp -r "$src" "$work/tests"
export ABX_HOME="$work/home" ABX_WARM_POOL="${ABX_WARM_POOL:-1}"
abx() { node "$root/dist/cli.js" "$@"; }

# The sandboxes' egress leaves from a network namespace of this run's own with only its loopback:
# E2B's network tests fetch public addresses, and no packet of theirs may leave this machine
# (they fail here instead, as docs/e2b.md says). Needs root, as the rest of the run does.
egress_ns="abx-peer-egress-$$"
ip netns add "$egress_ns"
ip -n "$egress_ns" link set lo up
export ABX_EGRESS_NETNS="/run/netns/$egress_ns"

cleanup() {
  abx kill --all >/dev/null 2>&1 || true
  abx daemon stop >/dev/null 2>&1 || true
  ip netns delete "$egress_ns" 2>/dev/null || true
}
trap cleanup EXIT
trap "exit 143" INT TERM

# `from '../../src'`, `'../src/index.js'`, `'../../../src/errors'`, `'../../src/sandbox/filesystem'`:
# what the package exports. Imports of other internals stay, and their files fail to load.
find "$work/tests" -name '*.ts' -print0 | xargs -0 sed -i -E \
  "s#from '(\.\./)+src(/index(\.js)?|/errors(\.js)?|/sandbox/filesystem)?'#from 'e2b'#"

live=()
while IFS= read -r file; do
  grep -qE 'msw|vi\.(do)?[mM]ock' "$file" && continue
  live+=("${file#"$work/"}")
done < <(grep -rlE 'sandboxTest|Sandbox\.create' "$work/tests" --include='*.test.ts' | grep -v /runtimes/ | sort)

if [[ -n ${PEER_ROOT_IMAGE:-} ]]; then
  export ABX_E2B_BASE_TEMPLATE=peer-root-base
fi

if [[ $mode == domain ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -keyout "$work/key.pem" -out "$work/cert.pem" -subj /CN=abx.test \
    -addext 'subjectAltName=DNS:abx.test,DNS:*.abx.test' 2>/dev/null
  info=$(abx daemon start --listen 127.0.0.1:0 --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" --domain abx.test --json)
  cat >"$work/resolve.cjs" <<'EOF'
const dns = require('node:dns');
const lookup = dns.lookup;
dns.lookup = function (host, options, callback) {
  if (typeof options === 'function') { callback = options; options = {}; }
  if (/(^|\.)abx\.test$/.test(host)) {
    return options.all ? callback(null, [{ address: '127.0.0.1', family: 4 }]) : callback(null, '127.0.0.1', 4);
  }
  return lookup.call(this, host, options, callback);
};
EOF
  eval "$(abx e2b env --domain)"
  export NODE_EXTRA_CA_CERTS="$work/cert.pem" NODE_OPTIONS="-r $work/resolve.cjs"
else
  info=$(abx daemon start --json)
  eval "$(abx e2b env 2>/dev/null)"
fi
if [[ -n ${PEER_ROOT_IMAGE:-} ]]; then
  printf 'name: peer-root-base\nimage: %s\nallow_root: true\n' "$PEER_ROOT_IMAGE" >"$work/root-base.yaml"
  abx template build "$work/root-base.yaml" >&2
fi
echo "daemon: $(node -e 'const i=JSON.parse(process.argv[1]); console.log(i.remote?.gatewayUrl ?? i.gatewayUrl)' "$info"); E2B_API_URL=${E2B_API_URL:-} E2B_DOMAIN=${E2B_DOMAIN:-}" >&2

cat >"$work/vitest.config.mts" <<'EOF'
import { defineConfig } from 'vitest/config';
export default defineConfig({
  test: { testTimeout: 60_000, hookTimeout: 60_000, fileParallelism: false, environment: 'node' },
});
EOF
cd "$work"
status=0
npx vitest run --root "$work" --config "$work/vitest.config.mts" --reporter=default \
  --reporter=json --outputFile.json="$work/report.json" "${live[@]}" "$@" >"$work/output.txt" 2>&1 || status=$?
node -e '
const r = require(process.argv[1]);
const lines = [];
for (const file of r.testResults) {
  const name = file.name.replace(/.*\/tests\//, "tests/");
  const counts = {};
  for (const t of file.assertionResults) counts[t.status] = (counts[t.status] ?? 0) + 1;
  lines.push(`${name}: ${Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ") || file.message.split("\n")[0]}`);
  for (const t of file.assertionResults) {
    if (t.status === "failed") lines.push(`  FAIL ${t.fullName}: ${(t.failureMessages[0] ?? "").split("\n")[0].slice(0, 300)}`);
  }
}
lines.push(`total: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped, of ${r.numTotalTests}; ${r.numFailedTestSuites} files failed to run or had failures`);
console.log(lines.join("\n"));
' "$work/report.json" | tee "$work/summary.txt"
exit $status
