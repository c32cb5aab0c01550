#!/usr/bin/env bash
# initdb a new cluster, as the postgres OS user, with tsoracle preloaded (its tables in the
# database `postgres`), listening on 127.0.0.1:PORT and on a socket in SOCKDIR; each extra
# NAME=VALUE argument becomes a postgresql.conf setting. Used by `make run` (run.sh), `make
# bench` and the package test. Run as root; DATA must not exist yet.
#
# Usage: scripts/init-cluster.sh BIN DATA PORT SOCKDIR [NAME=VALUE ...]
set -euo pipefail
BIN=${1:?usage: init-cluster.sh BIN DATA PORT SOCKDIR [NAME=VALUE ...]}
DATA=${2:?usage: init-cluster.sh BIN DATA PORT SOCKDIR [NAME=VALUE ...]}
PORT=${3:?usage: init-cluster.sh BIN DATA PORT SOCKDIR [NAME=VALUE ...]}
SOCKDIR=${4:?usage: init-cluster.sh BIN DATA PORT SOCKDIR [NAME=VALUE ...]}
shift 4

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! runuser -u postgres -- "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 >"$log" 2>&1; then
    cat "$log" >&2
    echo "init-cluster: initdb $DATA failed" >&2
    exit 1
fi
{
    echo "# --- tsoracle (scripts/init-cluster.sh) ---"
    echo "listen_addresses = '127.0.0.1'"
    echo "port = $PORT"
    echo "unix_socket_directories = '$SOCKDIR'"
    echo "shared_preload_libraries = 'tsoracle'"
    echo "tsoracle.database = 'postgres'"
    for setting in "$@"; do echo "${setting%%=*} = '${setting#*=}'"; done
} >>"$DATA/postgresql.conf"
