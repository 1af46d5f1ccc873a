#!/usr/bin/env bash
# Runs idemdb-compare with a throwaway PostgreSQL and Redis on 127.0.0.1, both keeping their data
# on the real disk (under target/), both durable per write:
#   PostgreSQL: fsync=on, synchronous_commit=on (started by scripts/with-postgres)
#   Redis:      appendonly yes, appendfsync always
# Installs them with apt if missing. Extra arguments go to the harness, e.g.
#   compare/run.sh --seconds 1 --callers 1,64
# Ports: PG_PORT (default: a free one), REDIS_PORT (default 63790).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
# PostgreSQL comes from the one script the tests and CI use too: this script runs inside it.
if [[ -z "${IDEMDB_PG_URL:-}" ]]; then
    exec scripts/with-postgres "$ROOT/compare/run.sh" "$@"
fi
REDIS_PORT=${REDIS_PORT:-63790}

log() { echo "run.sh: $*" >&2; }

# --- install -------------------------------------------------------------------------------
if ! command -v redis-server >/dev/null 2>&1; then
    log "installing redis-server"
    # Keep the package from starting its own default server (port 6379).
    made_policy=
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        made_policy=1
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server
    [[ -z "$made_policy" ]] || rm -f /usr/sbin/policy-rc.d
fi

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if port_busy "$REDIS_PORT"; then
    log "port $REDIS_PORT is already in use (set REDIS_PORT)"
    exit 1
fi

# --- start ---------------------------------------------------------------------------------
mkdir -p "$ROOT/target/compare/servers"
SRV=$(mktemp -d "$ROOT/target/compare/servers/run-XXXXXX")
REDIS_DIR="$SRV/redis"
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
    if ((status != 0)) && [[ -f "$SRV/redis.log" ]]; then
        log "last lines of $SRV/redis.log:"
        tail -n 20 "$SRV/redis.log" >&2
    fi
    rm -rf "$SRV"
    exit "$status"
}
HARNESS_PID=
trap stop_servers EXIT
trap '[[ -z "$HARNESS_PID" ]] || kill -TERM "$HARNESS_PID" 2>/dev/null; exit 130' INT TERM

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
    --postgres "$IDEMDB_PG_URL" \
    --redis "127.0.0.1:$REDIS_PORT" \
    "$@" &
HARNESS_PID=$!
wait "$HARNESS_PID"
HARNESS_PID=
