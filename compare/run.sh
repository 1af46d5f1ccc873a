#!/usr/bin/env bash
# Runs idemdb-compare with a throwaway PostgreSQL and Redis on 127.0.0.1, both keeping their data
# on the real disk (under target/compare/servers), both durable per write:
#   PostgreSQL: fsync=on, synchronous_commit=on
#   Redis:      appendonly yes, appendfsync always
# Installs them with apt if missing. Extra arguments go to the harness, e.g.
#   compare/run.sh --seconds 1 --callers 1,64
# Ports: PG_PORT (default 54329), REDIS_PORT (default 63790).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PG_PORT=${PG_PORT:-54329}
REDIS_PORT=${REDIS_PORT:-63790}

log() { echo "run.sh: $*" >&2; }

pg_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
        echo "$dir"
    fi
}

# --- install -------------------------------------------------------------------------------
missing=()
[[ -n "$(pg_bindir)" ]] || missing+=(postgresql)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    # Keep the packages from starting their own default servers (port 5432, 6379).
    made_policy=
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        made_policy=1
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    [[ -z "$made_policy" ]] || rm -f /usr/sbin/policy-rc.d
fi
PG_BIN=$(pg_bindir)
[[ -n "$PG_BIN" ]] || { log "no PostgreSQL binaries under /usr/lib/postgresql/*/bin"; exit 1; }
id postgres >/dev/null 2>&1 || { log "no postgres OS user"; exit 1; }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$PG_PORT" "$REDIS_PORT"; do
    if port_busy "$port"; then
        log "port $port is already in use (set PG_PORT / REDIS_PORT)"
        exit 1
    fi
done

# --- start ---------------------------------------------------------------------------------
mkdir -p "$ROOT/target/compare/servers"
SRV=$(mktemp -d "$ROOT/target/compare/servers/run-XXXXXX")
PG_DIR="$SRV/pg"
REDIS_DIR="$SRV/redis"
PG_PID=
REDIS_PID=

stop_servers() {
    local status=$?
    if [[ -n "$HARNESS_PID" ]]; then
        # Interrupted: let the harness go, then remove the data directory it could not.
        wait "$HARNESS_PID" 2>/dev/null || true
        rm -rf "$ROOT/target/compare/data/run-"*"-$HARNESS_PID"
    fi
    if [[ -n "$REDIS_PID" ]]; then
        kill "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
        log "redis (pid $REDIS_PID) stopped"
    fi
    if [[ -n "$PG_PID" ]]; then
        # SIGINT: fast shutdown. The postmaster is not our child (runuser started it), so poll.
        kill -INT "$PG_PID" 2>/dev/null || true
        for _ in $(seq 1 300); do
            kill -0 "$PG_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$PG_PID" 2>/dev/null; then
            log "postgres (pid $PG_PID) did not stop in 30 s; killing it"
            kill -KILL "$PG_PID" 2>/dev/null || true
        fi
        log "postgres (pid $PG_PID) stopped"
    fi
    if ((status != 0)); then
        for f in "$SRV/pg.log" "$SRV/redis.log"; do
            [[ -f "$f" ]] && { log "last lines of $f:"; tail -n 20 "$f" >&2; }
        done
    fi
    rm -rf "$SRV"
    exit "$status"
}
HARNESS_PID=
trap stop_servers EXIT
trap '[[ -z "$HARNESS_PID" ]] || kill -TERM "$HARNESS_PID" 2>/dev/null; exit 130' INT TERM

# PostgreSQL refuses to run as root: the cluster belongs to the postgres OS user.
mkdir -p "$PG_DIR"
chown -R postgres:postgres "$SRV"
chmod 700 "$SRV"
runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DIR" -U postgres --auth=trust -E UTF8 \
    >"$SRV/pg-initdb.log" 2>&1 || { cat "$SRV/pg-initdb.log" >&2; exit 1; }
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR" -l "$SRV/pg.log" -w -t 60 start -o \
    "-p $PG_PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$SRV \
     -c fsync=on -c synchronous_commit=on -c max_connections=400 -c shared_buffers=256MB" \
    >/dev/null
PG_PID=$(head -n 1 "$PG_DIR/postmaster.pid")
log "postgres $("$PG_BIN/postgres" --version | awk '{print $3}') (pid $PG_PID) on 127.0.0.1:$PG_PORT, data in $PG_DIR"
for _ in $(seq 1 100); do
    runuser -u postgres -- "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
    sleep 0.1
done
runuser -u postgres -- "$PG_BIN/psql" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres \
    -c "CREATE DATABASE idem"

mkdir -p "$REDIS_DIR"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$REDIS_DIR" \
    --appendonly yes --appendfsync always --save "" --daemonize no \
    >"$SRV/redis.log" 2>&1 &
REDIS_PID=$!
for i in $(seq 1 100); do
    if [[ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]; then
        break
    fi
    kill -0 "$REDIS_PID" 2>/dev/null || { log "redis-server exited"; exit 1; }
    ((i < 100)) || { log "redis-server did not answer"; exit 1; }
    sleep 0.1
done
log "redis $(redis-server --version | awk '{print $3}' | sed 's/^v=//') (pid $REDIS_PID) on 127.0.0.1:$REDIS_PORT," \
    "appendfsync $(redis-cli -p "$REDIS_PORT" config get appendfsync | tail -n 1), data in $REDIS_DIR"

# --- run -----------------------------------------------------------------------------------
# In the background and waited for, so that a signal (Ctrl-C, `timeout`) runs the traps at once:
# the harness is told to stop, then the EXIT trap stops the servers. `cargo run` execs the
# harness, so HARNESS_PID is the harness itself.
cargo run --release -p idemdb-compare -- \
    --postgres "host=127.0.0.1 port=$PG_PORT user=postgres dbname=idem" \
    --redis "127.0.0.1:$REDIS_PORT" \
    "$@" &
HARNESS_PID=$!
wait "$HARNESS_PID"
HARNESS_PID=
