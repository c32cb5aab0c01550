#!/usr/bin/env bash
# Install what tsoracle needs, idempotently, on a Debian machine (run as root), and no more
# than what is asked:
#
#   scripts/install-deps.sh [MAJOR]     build and install for one PostgreSQL major (default 15):
#                                       clang/libclang for bindgen, pkg-config, make, libpq
#                                       (a member connects to its oracle with it, and
#                                       tsoracle-relay to every cluster), that
#                                       major (Debian's packages for 15, with its server
#                                       headers; the pinned build of scripts/pg-install.sh for
#                                       16-18, which needs patchelf), cargo-pgrx 0.18.0
#                                       initialised against it. `make install` and `make run`.
#   scripts/install-deps.sh --test      everything `make test` needs besides: every major of
#                                       scripts/postgresql-versions, sudo (`cargo pgrx test
#                                       --runas`), Patroni and etcd (server and etcdctl) for the
#                                       high-availability tests, PgBouncer, postgres_exporter
#                                       and Prometheus (for promtool) for the pooler suite.
#   scripts/install-deps.sh --print …   say what the call would install (Debian packages and
#                                       PostgreSQL installations), one per line; change nothing.
set -euo pipefail

PGRX_VERSION=0.18.0
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD_PACKAGES=(libclang-dev clang pkg-config make libpq-dev)
TEST_PACKAGES=(sudo patroni etcd-server etcd-client pgbouncer prometheus-postgres-exporter prometheus)
# The systemd units of TEST_PACKAGES that Debian starts (and enables) on install, as
# package:unit: the tests start their own instances on free loopback ports, and these must not
# hold 6432 (PgBouncer's socket unit listens there too), 9187 and 9090.
TEST_SERVICES=(pgbouncer:pgbouncer.socket pgbouncer:pgbouncer.service
    prometheus-postgres-exporter:prometheus-postgres-exporter.service prometheus:prometheus.service)

print=0 test=0 major=15
for arg in "$@"; do
    case "$arg" in
    --print) print=1 ;;
    --test) test=1 ;;
    -*) echo "install-deps: unknown option $arg" >&2; exit 2 ;;
    *) major=$arg ;;
    esac
done

source_of() { awk -v m="$1" '$1 == m && $0 !~ /^#/ {print $2}' "$HERE/postgresql-versions"; }
if ((test)); then
    majors=($(awk '$0 !~ /^#/ && $1 ~ /^[0-9]+$/ {print $1}' "$HERE/postgresql-versions"))
else
    [ -n "$(source_of "$major")" ] || { echo "install-deps: PostgreSQL $major is not supported (scripts/postgresql-versions)" >&2; exit 2; }
    majors=("$major")
fi

packages=("${BUILD_PACKAGES[@]}")
((test)) && packages+=("${TEST_PACKAGES[@]}")
for m in "${majors[@]}"; do
    case "$(source_of "$m")" in
    debian)
        packages+=("postgresql-$m" "postgresql-server-dev-$m" "postgresql-client-$m")
        # pg_repack for the tests of the tools that follow a table (tests/tests/repack.rs).
        ((test)) && packages+=("postgresql-$m-repack")
        ;;
    wheel) [[ " ${packages[*]} " == *" patchelf "* ]] || packages+=(patchelf) ;;
    esac
done

if ((print)); then
    printf 'package %s\n' "${packages[@]}"
    printf 'postgresql %s\n' "${majors[@]}"
    exit 0
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "==> installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# What this run installed and Debian started on install is stopped again; nothing else is
# touched. A host's own PostgreSQL cluster or etcd, running before, keeps running: the tests
# start their own servers on free loopback ports (scripts/test-install-deps.sh checks it).
installed_now() { [[ " ${missing[*]} " == *" $1 "* ]]; }
# The Debian package starts its own cluster (15/main on port 5432) when it is installed.
for m in "${majors[@]}"; do
    [ "$(source_of "$m")" = debian ] && installed_now "postgresql-$m" || continue
    if command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q "^$m *main .*online"; then
        pg_ctlcluster "$m" main stop || true
    fi
done
# The etcd service Debian starts with etcd-server (the Patroni tests start their own).
if installed_now etcd-server && command -v systemctl >/dev/null \
    && systemctl is-active --quiet etcd 2>/dev/null; then
    systemctl disable --now etcd 2>/dev/null || true
fi

# Nor the services PgBouncer, postgres_exporter and Prometheus start on install (the pooler
# suite starts its own on free loopback ports): stopped and disabled when this run installed
# them, so a machine's own PgBouncer or Prometheus, installed before, is left as it was.
if command -v systemctl >/dev/null && ((${#missing[@]})); then
    for s in "${TEST_SERVICES[@]}"; do
        installed_now "${s%%:*}" || continue
        systemctl disable --now "${s#*:}" 2>/dev/null || true
    done
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
    echo "==> installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install --locked cargo-pgrx --version "$PGRX_VERSION"
fi

# pgrx knows every installation it was initialised against: keep those it already has, add
# the ones asked for (a later `make install PG_MAJOR=18` must not make it forget 15).
config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
declare -A known=()
if [ -f "$config" ]; then
    while read -r name path; do
        [ -x "$path" ] && known[$name]=$path
    done < <(sed -nE 's/^(pg[0-9]+) = "(.*)"$/\1 \2/p' "$config")
fi
want=0
for m in "${majors[@]}"; do
    pg_config="$("$HERE/pg-install.sh" "$m")/pg_config"
    [ "${known[pg$m]:-}" = "$pg_config" ] || want=1
    known[pg$m]=$pg_config
done
if ((want)); then
    init_args=()
    for name in "${!known[@]}"; do init_args+=("--$name" "${known[$name]}"); done
    echo "==> cargo pgrx init ${init_args[*]}"
    cargo pgrx init "${init_args[@]}"
fi
