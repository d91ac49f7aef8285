#!/usr/bin/env bash
# A throw-away local PostgreSQL cluster for corgipile development and tests (PostgreSQL 15
# unless CORGIPILE_PG_BIN names another install's bin dir; `make ... PG=18` sets it).
#
# Usage: scripts/cluster.sh start|stop|restart|status|psql [ARGS...]|env|destroy
#
#   start     initdb on first use, then start the server (no-op if running),
#             and wait until it accepts connections
#   stop      pg_ctl stop -m fast (no-op if not running)
#   restart   stop, then start
#   status    print whether the server is running; exit 0 if it is, 3 if not
#   psql      exec psql against the cluster (user postgres); extra args go to psql
#   env       print `export PGHOST=... PGPORT=... PGUSER=postgres`, for
#             eval "$(scripts/cluster.sh env)"
#   destroy   stop the server and delete the cluster directory
#
# Environment:
#   CORGIPILE_CLUSTER_DIR  cluster directory (default /tmp/corgipile-cluster);
#                          PGDATA is $DIR/data, the unix socket lives in $DIR,
#                          the server log is $DIR/log
#   CORGIPILE_PORT         port (default 28815); only a unix socket is opened,
#                          no TCP listener
#
# The server runs as the `postgres` OS user (PostgreSQL refuses to run as
# root): via runuser when we are root, via sudo otherwise. The cluster uses
# trust authentication and fsync=off: it is for tests only, never for data
# you care about.
set -euo pipefail

PG_BIN="${CORGIPILE_PG_BIN:-/usr/lib/postgresql/15/bin}"  # overridable: a relocated copy for development
DIR="${CORGIPILE_CLUSTER_DIR:-/tmp/corgipile-cluster}"
PORT="${CORGIPILE_PORT:-28815}"
DATA="$DIR/data"
LOG="$DIR/log"
PG_OS_USER="postgres"

die() { echo "cluster.sh: $*" >&2; exit 1; }

# Run a command as the postgres OS user, from a directory it can read.
as_pg() {
    if [ "$(id -un)" = "$PG_OS_USER" ]; then
        (cd / && "$@")
    elif [ "$(id -u)" -eq 0 ]; then
        (cd / && runuser -u "$PG_OS_USER" -- "$@")
    else
        (cd / && sudo -u "$PG_OS_USER" -- "$@")
    fi
}

is_running() {
    [ -f "$DATA/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1
}

cmd_init() {
    id "$PG_OS_USER" >/dev/null 2>&1 || die "OS user '$PG_OS_USER' does not exist (is postgresql-15 installed? run scripts/setup.sh)"
    [ -x "$PG_BIN/initdb" ] || die "$PG_BIN/initdb not found (run scripts/setup.sh)"
    if [ ! -d "$DIR" ]; then
        if [ "$(id -u)" -eq 0 ]; then
            mkdir -p "$DIR"
            chown "$PG_OS_USER:" "$DIR"
        else
            as_pg mkdir -p "$DIR"
        fi
    fi
    # Others (e.g. root or a developer account) must reach the socket in $DIR.
    as_pg chmod 755 "$DIR"
    if [ -f "$DATA/PG_VERSION" ]; then
        return 0
    fi
    echo "cluster.sh: initdb $DATA"
    local out
    out="$(as_pg "$PG_BIN/initdb" -D "$DATA" --auth=trust -U postgres -E UTF8 --locale=C.UTF-8 2>&1)" \
        || { echo "$out" >&2; die "initdb failed"; }
    as_pg tee -a "$DATA/postgresql.conf" >/dev/null <<EOF

# ---- corgipile throw-away test cluster (scripts/cluster.sh) ----
listen_addresses = ''
unix_socket_directories = '$DIR'
port = $PORT
shared_buffers = 1GB
max_wal_size = 4GB
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
}

cmd_start() {
    cmd_init
    if is_running; then
        echo "cluster.sh: already running (socket $DIR, port $PORT)"
    else
        # Port and socket directory on the command line so that
        # CORGIPILE_PORT can change between runs.
        # Without RUST_BACKTRACE in the server's environment: pgrx would otherwise attach a Rust
        # backtrace to the DETAIL of every ERROR raised inside the executor nodes.
        if ! as_pg env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE "$PG_BIN/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 120 \
                -o "-p $PORT -k '$DIR'" >/dev/null; then
            echo "cluster.sh: server failed to start; last lines of $LOG:" >&2
            as_pg tail -n 30 "$LOG" >&2 || true
            exit 1
        fi
    fi
    local i
    for i in $(seq 1 60); do
        if "$PG_BIN/pg_isready" -q -h "$DIR" -p "$PORT" -U postgres; then
            echo "cluster.sh: ready (PGHOST=$DIR PGPORT=$PORT PGUSER=postgres)"
            return 0
        fi
        sleep 1
    done
    as_pg tail -n 30 "$LOG" >&2 || true
    die "server did not become ready on $DIR port $PORT"
}

cmd_stop() {
    if is_running; then
        as_pg "$PG_BIN/pg_ctl" stop -D "$DATA" -m fast -w >/dev/null
        echo "cluster.sh: stopped"
    else
        echo "cluster.sh: not running"
    fi
}

cmd_status() {
    if is_running; then
        echo "cluster.sh: running (PGDATA=$DATA, socket $DIR, port $PORT, log $LOG)"
        return 0
    elif [ -f "$DATA/PG_VERSION" ]; then
        echo "cluster.sh: stopped (PGDATA=$DATA)"
    else
        echo "cluster.sh: not initialised ($DIR)"
    fi
    return 3
}

cmd_destroy() {
    cmd_stop
    if [ -d "$DIR" ]; then
        case "$DIR" in
            /|"") die "refusing to delete '$DIR'" ;;
        esac
        if [ "$(id -u)" -eq 0 ]; then rm -rf -- "$DIR"; else as_pg rm -rf -- "$DIR"; fi
        echo "cluster.sh: removed $DIR"
    fi
}

sub="${1:-}"
[ $# -gt 0 ] && shift
case "$sub" in
    start)   cmd_start ;;
    stop)    cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status)  cmd_status ;;
    psql)    exec "$PG_BIN/psql" -h "$DIR" -p "$PORT" -U postgres "$@" ;;
    env)     printf 'export PGHOST=%q PGPORT=%q PGUSER=postgres\n' "$DIR" "$PORT" ;;
    destroy) cmd_destroy ;;
    -h|--help|help) sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    *) sed -n '5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
