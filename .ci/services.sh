#!/usr/bin/env bash
# The servers the tests use, from Debian's packages: PostgreSQL (trust auth on 127.0.0.1:5432,
# the tests' metadata and MLflow stores) and Redis (127.0.0.1:6379, the Celery broker).
#
#   .ci/services.sh install        apt-get install what is missing (once per machine)
#   .ci/services.sh start          start what is not already listening; state in $STATE
#   .ci/services.sh stop           stop what `start` started (by process group), nothing else
#   .ci/services.sh run -- CMD...  start, run CMD, stop what was started; exit with CMD's code
#
# Each server runs in its own process group (setsid) and is stopped by that group id. A server
# already listening on the port (another clone's, or one started by hand) is reused and left
# running. The PostgreSQL cluster is new each start (initdb in a temporary folder, fsync off):
# the tests create and drop their own databases, so nothing of a previous run is kept.
set -euo pipefail

PG_PORT="${TIDAL_PG_PORT:-5432}"
REDIS_PORT="${TIDAL_REDIS_PORT:-6379}"
STATE="${TIDAL_SERVICES_STATE:-/var/tmp/tidal-services-$(id -u)-$PG_PORT}"

log() { echo "services: $*" >&2; }
die() { echo "error: services: $*" >&2; exit 1; }

pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x "$d/postgres" && -x "$d/initdb" ]] && { echo "$d"; return 0; }
  done
  return 1
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "installing packages needs root (or sudo): $*"; fi
}

install() {
  local missing=()
  pg_bindir >/dev/null || missing+=(postgresql)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v etcd >/dev/null || missing+=(etcd-server)  # the Kubernetes API server tests (tests/cluster/kube.py)
  [[ ${#missing[@]} -eq 0 ]] && return 0
  log "installing ${missing[*]} from Debian's packages"
  # Keep the packages' own init scripts from starting a server on our ports (the Debian
  # cluster 'main' uses password auth on 5432): policy-rc.d exit 101 = "action forbidden".
  local policy=/usr/sbin/policy-rc.d added=0
  if [[ ! -e $policy ]]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"; added=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    # A fresh machine may have empty package lists: update once, then retry.
    as_root apt-get update -q >/dev/null
    as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
  [[ $added -eq 1 ]] && as_root rm -f "$policy"
  pg_bindir >/dev/null || die "PostgreSQL is still missing after apt-get install postgresql"
  command -v redis-server >/dev/null || die "redis-server is still missing after apt-get install"
  command -v etcd >/dev/null || die "etcd is still missing after apt-get install etcd-server"
}

pg_up() {
  local bin; bin=$(pg_bindir) || return 1
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 1
}

redis_up() { (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null; }

wait_for() {  # wait_for NAME SECONDS CHECK...
  local name=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@"; do
    (( SECONDS < deadline )) || return 1
    sleep 0.2
  done
}

start_pg() {
  if pg_up; then log "PostgreSQL already listening on 127.0.0.1:$PG_PORT: reused"; return 0; fi
  local bin data run_as=()
  bin=$(pg_bindir)
  data=$(mktemp -d /var/tmp/tidal-pg.XXXXXX)
  # PostgreSQL refuses to run as root: as root the cluster belongs to the 'postgres' user.
  if [[ $(id -u) -eq 0 ]]; then chown postgres: "$data"; run_as=(runuser -u postgres --); fi
  "${run_as[@]}" "$bin/initdb" -D "$data/db" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
    >"$data/initdb.log" 2>&1 || { cat "$data/initdb.log" >&2; die "initdb failed in $data"; }
  setsid "${run_as[@]}" "$bin/postgres" -D "$data/db" -h 127.0.0.1 -p "$PG_PORT" -k "$data" \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 \
    >"$data/postgres.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid $data" > "$STATE.pg"
  if ! wait_for postgres 60 pg_up; then
    tail -20 "$data/postgres.log" >&2; die "PostgreSQL did not accept connections within 60 s"
  fi
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT (pgid $pid, $data)"
}

start_redis() {
  if redis_up; then log "Redis already listening on 127.0.0.1:$REDIS_PORT: reused"; return 0; fi
  local dir; dir=$(mktemp -d /var/tmp/tidal-redis.XXXXXX)
  setsid redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
    --dir "$dir" >"$dir/redis.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid $dir" > "$STATE.redis"
  wait_for redis 30 redis_up || { tail -20 "$dir/redis.log" >&2; die "Redis did not start within 30 s"; }
  log "Redis on 127.0.0.1:$REDIS_PORT (pgid $pid)"
}

stop_one() {  # stop_one STATEFILE: kill the process group it names, then remove its folder
  local f=$1 pid dir
  [[ -f $f ]] || return 0
  read -r pid dir < "$f"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  [[ -n $dir && $dir == /var/tmp/tidal-* ]] && rm -rf "$dir"
  rm -f "$f"
}

start() { install; start_pg; start_redis; }
stop() { stop_one "$STATE.pg"; stop_one "$STATE.redis"; }

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  run)
    shift; [[ ${1:-} == -- ]] && shift
    [[ $# -gt 0 ]] || die "run needs a command: .ci/services.sh run -- CMD..."
    # Stop only what this invocation started: a state file left before us belongs to another.
    [[ -f $STATE.pg || -f $STATE.redis ]] && STATE="$STATE-$$"
    trap stop EXIT
    trap 'exit 130' INT  # a signal to the group still runs the EXIT trap: the servers stop too
    trap 'exit 143' TERM
    start
    rc=0; "$@" || rc=$?
    exit $rc ;;
  *) die "usage: .ci/services.sh install|start|stop|run -- CMD..." ;;
esac
