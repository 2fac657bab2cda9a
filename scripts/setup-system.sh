#!/usr/bin/env bash
# System packages agent-sandbox needs on a Debian machine: bubblewrap (the sandboxes), util-linux
# and e2fsprogs (a root daemon's launcher: unshare, setpriv, prlimit, mount, mkfs.ext4; Debian
# ships them, but slim images may not), python3 (what the tests run inside sandboxes) with matplotlib and pandas (envd's code contexts), patchelf
# (the portable Node runtime that sandboxes of any image run envd with), busybox-static (a root
# filesystem with no libc, for the portable runtime's tests), docker.io (dockerd: the Docker
# provider's engine; a `docker` CLI alone is not enough), debootstrap (the Debian image the Docker
# provider's tests import), postgresql (the PostgreSQL registry's tests: .ci/run starts a
# throwaway cluster with scripts/test-postgres.sh), docker-registry (distribution 2.8: the image
# push tests start one of their own on loopback; the package's own service is stopped and disabled
# here), iproute2 and openssl (the remote-client tests' network namespaces and test CA),
# slirp4netns, nftables and curl (the `internet` network: user-mode networking into a sandbox's
# namespace, the rules in it, and the client the egress tests run inside) and, for the command
# server's BROWSER group, Chromium. Installs only what is missing; needs root (or sudo).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
for tool in unshare setpriv prlimit mount; do
  command -v "$tool" >/dev/null 2>&1 || { missing+=(util-linux mount); break; }
done
command -v mkfs.ext4 >/dev/null 2>&1 || missing+=(e2fsprogs)
[ -x /usr/bin/python3 ] || missing+=(python3)
# envd's code contexts (POST /execute) are tested with plots and DataFrames in Debian's python3.
# The egress header rules' tests call an HTTPS API from a sandbox with requests (REQUESTS_CA_BUNDLE).
for pkg in python3-matplotlib python3-pandas python3-requests; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q ' installed' || missing+=("$pkg")
done
command -v patchelf >/dev/null 2>&1 || missing+=(patchelf)
# Debian's `busybox` package has /bin/busybox too, but linked to glibc: only the static one will do.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q ' installed' || missing+=(busybox-static)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
# The push tests run /usr/bin/docker-registry themselves (test/helpers/registry.ts).
[ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
# The server binaries (initdb, pg_ctl) live under /usr/lib/postgresql/VERSION/bin, not on PATH.
compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || missing+=(postgresql)
# The remote-client tests: two network namespaces joined by a veth pair (ip netns) and a test CA.
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ "${1:-}" != "--no-browser" ] && [ ! -x /usr/bin/chromium ]; then missing+=(chromium); fi
[ "${#missing[@]}" -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
if [[ " ${missing[*]} " == *" docker-registry "* ]]; then
  # Its postinst enables a registry on :5000 for everyone: the tests need only the binary.
  if [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
  else
    $sudo service docker-registry stop >/dev/null 2>&1 || true
    $sudo update-rc.d docker-registry disable >/dev/null 2>&1 || true
  fi
fi
echo "installed: ${missing[*]}"
