#!/usr/bin/env bash
# Make (or refresh) the private PostgreSQL installation of one major that the tests run
# against, and a pgrx home that points at it; print the private bin directory. `make test`
# builds, installs and runs everything there, so that neither `cargo pgrx test` (which copies
# its build over the library in place) nor the integration tests ever write into the
# installation a user's server runs from: a demo server started by `make run` keeps running,
# untouched, while `make test` runs.
#
# The copy is relocatable: PostgreSQL finds its library and share directories relative to
# its binaries, and pg_config reports the copy's own paths. The source is the installation
# scripts/pg-install.sh gives for MAJOR (Debian's layout for 15, one prefix for the others).
#
# Usage: scripts/test-pg.sh [--install] MAJOR ROOT PGRX_HOME
#   MAJOR: a name of scripts/postgresql-versions. --install: also install this tree's build
#   into the copy (scripts/install-ext.sh, built against the installation the copy is of).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

install=0
if [ "${1:-}" = --install ]; then install=1; shift; fi
MAJOR=${1:?usage: test-pg.sh [--install] MAJOR ROOT PGRX_HOME}
ROOT=${2:?usage: test-pg.sh [--install] MAJOR ROOT PGRX_HOME}
PGRX_HOME_DIR=${3:?usage: test-pg.sh [--install] MAJOR ROOT PGRX_HOME}
# ROOT is this script's own: it replaces directories in it and opens it to the postgres user.
# A ROOT that holds the source tree would open its demo clusters' data directories (0700) too.
case "$(cd "$HERE/.." && pwd)/" in
"$(realpath -m "$ROOT")"/*)
    echo "test-pg: ROOT ($ROOT) holds the source tree; give it a directory of its own (make test uses \$TEST_PG_ROOT/pg<major>)" >&2
    exit 2
    ;;
esac
SYSTEM_BIN=$("$HERE/pg-install.sh" "$MAJOR")

# Copy, then replace the old copy (never from a copy that still holds a tsoracle build: the
# source files win).
refresh() {
    local src=$1 dest=$2
    mkdir -p "$(dirname "$dest")"
    rm -rf "$dest.new"
    cp -a "$src" "$dest.new"
    rm -rf "$dest"
    mv "$dest.new" "$dest"
}

if [ "$SYSTEM_BIN" = "/usr/lib/postgresql/$MAJOR/bin" ]; then
    # Debian's layout: the binaries and libraries, the share directory and the headers.
    for d in "usr/lib/postgresql/$MAJOR" "usr/share/postgresql/$MAJOR" "usr/include/postgresql"; do
        refresh "/$d" "$ROOT/$d"
    done
    PRIVATE_BIN=$ROOT/usr/lib/postgresql/$MAJOR/bin
    COPY=$ROOT/usr
else
    # One prefix (bin, lib, share, include).
    refresh "$(dirname "$SYSTEM_BIN")" "$ROOT/prefix"
    PRIVATE_BIN=$ROOT/prefix/bin
    COPY=$ROOT/prefix
fi
PRIVATE_CONFIG=$PRIVATE_BIN/pg_config
pkglibdir=$("$PRIVATE_CONFIG" --pkglibdir)
sharedir=$("$PRIVATE_CONFIG" --sharedir)
case "$pkglibdir" in
"$ROOT"/*) ;;
*) echo "test-pg: $PRIVATE_CONFIG does not report its own location ($pkglibdir)" >&2; exit 1 ;;
esac
# Only the tests' own builds go in there.
rm -f "$pkglibdir/tsoracle.so" "$sharedir/extension"/tsoracle*
if [ "$install" = 1 ]; then
    "$HERE/install-ext.sh" "$SYSTEM_BIN/pg_config" "$PRIVATE_CONFIG" >&2
fi

if ! grep -qsF "pg${MAJOR%%-*} = \"$PRIVATE_CONFIG\"" "$PGRX_HOME_DIR/config.toml"; then
    mkdir -p "$PGRX_HOME_DIR"
    PGRX_HOME="$PGRX_HOME_DIR" cargo pgrx init "--pg${MAJOR%%-*}" "$PRIVATE_CONFIG" >&2
fi
# The postgres user (tests run the server as it) reads the copy; nothing else in ROOT is opened.
chmod a+rx "$ROOT"
chmod -R a+rX "$COPY"
echo "private PostgreSQL $MAJOR for the tests: $ROOT (pgrx home $PGRX_HOME_DIR)" >&2
echo "$PRIVATE_BIN"
