#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432, user postgres) and Redis (127.0.0.1:6379) are up for
# the test suite, starting them if they are absent, and that database "test" exists.
set -euo pipefail

PGHOST=${PGHOST:-127.0.0.1}
PGPORT=${PGPORT:-5432}
PGUSER=${PGUSER:-postgres}
REDIS_PORT=${REDIS_PORT:-6379}

port_open() {  # host port
  python3 - "$1" "$2" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
except OSError:
    sys.exit(1)
PY
}

pg_up() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$PGHOST" -p "$PGPORT"
  else
    port_open "$PGHOST" "$PGPORT"
  fi
}

redis_up() {
  if command -v redis-cli >/dev/null 2>&1; then
    [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]
  else
    port_open 127.0.0.1 "$REDIS_PORT"
  fi
}

wait_for() {  # name check
  for _ in $(seq 1 60); do
    if "$2"; then return 0; fi
    sleep 0.5
  done
  echo "services.sh: $1 did not come up" >&2
  return 1
}

if ! pg_up; then
  echo "services.sh: starting PostgreSQL" >&2
  if command -v service >/dev/null 2>&1; then
    service postgresql start >/dev/null || true
  fi
  if ! pg_up && command -v pg_ctlcluster >/dev/null 2>&1; then
    for cluster in /etc/postgresql/*/main; do
      [ -d "$cluster" ] || continue
      version=$(basename "$(dirname "$cluster")")
      pg_ctlcluster "$version" main start || true
    done
  fi
  wait_for PostgreSQL pg_up
fi

if ! redis_up; then
  echo "services.sh: starting Redis" >&2
  if command -v redis-server >/dev/null 2>&1; then
    redis-server --port "$REDIS_PORT" --daemonize yes >/dev/null
  elif command -v service >/dev/null 2>&1; then
    service redis-server start >/dev/null || true
  fi
  wait_for Redis redis_up
fi

if command -v psql >/dev/null 2>&1; then
  exists=$(psql -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = 'test'")
  if [ "$exists" != "1" ]; then
    psql -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d postgres -qc "CREATE DATABASE test"
  fi
fi
echo "services.sh: PostgreSQL and Redis are up" >&2
