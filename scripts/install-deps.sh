#!/usr/bin/env bash
# Install everything tsoracle needs to build and test, idempotently, on a Debian machine
# (run as root): PostgreSQL 15 with its server headers (Debian's), PostgreSQL 16, 17 and 18
# (scripts/pg-install.sh), clang for bindgen, sudo for `cargo pgrx test --runas`, Patroni and
# etcd (server and etcdctl) for the high-availability tests, patchelf (scripts/pg-install.sh), and
# cargo-pgrx 0.18.0 initialised against every one of those installations.
set -euo pipefail

PGRX_VERSION=0.18.0
HERE=$(cd "$(dirname "$0")" && pwd)
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-client-15 libclang-dev clang sudo pkg-config make
              patroni etcd-server etcd-client patchelf)

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "==> installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Debian package starts its own cluster on port 5432; we never use it.
if command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q '^15 *main .*online'; then
    pg_ctlcluster 15 main stop || true
fi

# Nor the Debian etcd service (the Patroni tests start their own etcd on free loopback ports).
if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
    systemctl stop etcd || true
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
    echo "==> installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install --locked cargo-pgrx --version "$PGRX_VERSION"
fi

# Every supported major (scripts/postgresql-versions), for `make install PG_MAJOR=N`,
# `make lint` and `make package`.
init_args=()
wanted=()
for major in $(awk '$0 !~ /^#/ && $1 ~ /^[0-9]+$/ {print $1}' "$HERE/postgresql-versions"); do
    pg_config="$("$HERE/pg-install.sh" "$major")/pg_config"
    init_args+=("--pg$major" "$pg_config")
    wanted+=("pg$major = \"$pg_config\"")
done
config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
for w in "${wanted[@]}"; do
    if ! grep -qsF "$w" "$config"; then
        echo "==> cargo pgrx init ${init_args[*]}"
        cargo pgrx init "${init_args[@]}"
        break
    fi
done
