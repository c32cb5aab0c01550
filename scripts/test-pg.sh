#!/usr/bin/env bash
# Make (or refresh) the private PostgreSQL installation the tests run against, and a pgrx
# home that points at it. `make test` builds, installs and runs everything there, so that
# neither `cargo pgrx test` (which copies its build over the library in place) nor the
# integration tests ever write into the installation a user's server runs from: a demo
# server started by `make run` keeps running, untouched, while `make test` runs.
#
# The copy is relocatable: PostgreSQL finds its library and share directories relative to
# its binaries, and pg_config reports the copy's own paths.
#
# Usage: scripts/test-pg.sh ROOT PGRX_HOME   (system installation: /usr/lib/postgresql/15)
set -euo pipefail

ROOT=${1:?usage: test-pg.sh ROOT PGRX_HOME}
PGRX_HOME_DIR=${2:?usage: test-pg.sh ROOT PGRX_HOME}
MAJOR=15
SYSTEM_CONFIG=/usr/lib/postgresql/$MAJOR/bin/pg_config
PRIVATE_CONFIG=$ROOT/usr/lib/postgresql/$MAJOR/bin/pg_config

# Refresh from the system installation (rsync-like: copy, then drop what vanished), but
# never from a copy that still holds a tsoracle build: the system files win.
mkdir -p "$ROOT/usr/lib/postgresql" "$ROOT/usr/share/postgresql" "$ROOT/usr/include"
for d in "usr/lib/postgresql/$MAJOR" "usr/share/postgresql/$MAJOR" "usr/include/postgresql"; do
    rm -rf "${ROOT:?}/$d.new"
    cp -a "/$d" "$ROOT/$d.new"
    rm -rf "${ROOT:?}/$d"
    mv "$ROOT/$d.new" "$ROOT/$d"
done
# Only the tests' own builds go in there.
rm -f "$ROOT/usr/lib/postgresql/$MAJOR/lib/tsoracle.so" "$ROOT/usr/share/postgresql/$MAJOR/extension"/tsoracle*

[ "$("$PRIVATE_CONFIG" --pkglibdir)" = "$ROOT/usr/lib/postgresql/$MAJOR/lib" ] || {
    echo "test-pg: $PRIVATE_CONFIG does not report its own location" >&2
    exit 1
}
"$SYSTEM_CONFIG" --version >/dev/null

if ! grep -qs "pg$MAJOR = \"$PRIVATE_CONFIG\"" "$PGRX_HOME_DIR/config.toml"; then
    mkdir -p "$PGRX_HOME_DIR"
    PGRX_HOME="$PGRX_HOME_DIR" cargo pgrx init "--pg$MAJOR" "$PRIVATE_CONFIG" >&2
fi
chmod -R a+rX "$ROOT"
echo "private PostgreSQL $MAJOR for the tests: $ROOT (pgrx home $PGRX_HOME_DIR)" >&2
