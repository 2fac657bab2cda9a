#!/usr/bin/env bash
# System packages agent-sandbox needs on a Debian machine: bubblewrap (the sandboxes) and, for the
# command server's BROWSER group, Chromium. Installs only what is missing; needs root (or sudo).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ "${1:-}" != "--no-browser" ] && [ ! -x /usr/bin/chromium ]; then missing+=(chromium); fi
[ "${#missing[@]}" -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}"
