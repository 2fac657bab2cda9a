#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests (Debian's postgresql package), on 127.0.0.1 only,
# with trust authentication: never for anything but tests.
#
#   scripts/test-postgres.sh start [DIR] [PORT]   make the cluster in DIR if needed and start it;
#                                                 prints its URL (postgres://postgres@127.0.0.1:PORT/postgres)
#   scripts/test-postgres.sh stop [DIR]           stop it (its data stays: start again to reuse)
#   scripts/test-postgres.sh destroy [DIR]        stop it and remove DIR
#
# DIR defaults to /tmp/abx-test-pg, PORT to 5433. As root the server runs as the `postgres` user
# (PostgreSQL refuses to run as root); otherwise as the caller.
set -euo pipefail

command=${1:-}
dir=${2:-/tmp/abx-test-pg}
port=${3:-5433}

bin=""
for candidate in /usr/lib/postgresql/*/bin; do
  [ -x "$candidate/pg_ctl" ] && bin=$candidate
done
if [ -z "$bin" ]; then
  echo "no PostgreSQL server found under /usr/lib/postgresql: install Debian's postgresql (scripts/setup-system.sh)" >&2
  exit 1
fi

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$command" in
  start)
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      mkdir -p "$dir"
      [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
      as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 \
        --no-instructions >"$dir/initdb.log" 2>&1 || {
        echo "initdb failed; $dir/initdb.log ends:" >&2
        tail -n 20 "$dir/initdb.log" >&2
        exit 1
      }
    fi
    # Sockets in DIR (not /var/run/postgresql, which may not exist or belong to another cluster).
    if ! as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null; then
      echo "PostgreSQL did not start on port $port; $dir/server.log ends:" >&2
      tail -n 20 "$dir/server.log" >&2
      exit 1
    fi
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    [ -f "$dir/data/postmaster.pid" ] || exit 0
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null
    ;;
  destroy)
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >/dev/null || true
    fi
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start|stop|destroy [DIR] [PORT]" >&2
    exit 2
    ;;
esac
