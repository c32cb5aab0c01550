#!/usr/bin/env bash
# Install tsoracle into the PostgreSQL that PG_CONFIG names, without harming a server that
# runs from it: the package is built first (cargo pgrx package), then every file is copied
# to a temporary name beside its destination and renamed into place, as install(1) and dpkg
# do. A running server keeps the library it has mapped (the old file lives on until it
# closes it) and loads the new one at its next start; a library copied over in place would
# instead change under its feet (SIGBUS, SIGSEGV: the whole server restarts).
#
# Also installs the frozen install scripts of earlier versions (sql/tsoracle--X.sql), so
# that CREATE EXTENSION tsoracle VERSION 'X' followed by ALTER EXTENSION ... UPDATE works.
#
# Usage: scripts/install-ext.sh [pg_config]   (INSTALL_PROFILE=debug for a debug build)
set -euo pipefail
cd "$(dirname "$0")/.."

PG_CONFIG=${1:-${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}}
profile_flag=()
profile_dir=release
if [ "${INSTALL_PROFILE:-release}" = debug ]; then
    profile_flag=(--debug)
    profile_dir=debug
fi
major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
out="target/$profile_dir/tsoracle-pg$major"
rm -rf "$out"
cargo pgrx package "${profile_flag[@]}" --pg-config "$PG_CONFIG" --out-dir "$out" >&2

pkglibdir=$("$PG_CONFIG" --pkglibdir)
extdir="$("$PG_CONFIG" --sharedir)/extension"

# place SRC DEST: copy to a temporary file in DEST's directory, then rename over DEST.
place() {
    local src=$1 dest=$2 mode=$3 tmp
    install -d "$(dirname "$dest")"
    tmp=$(mktemp "$(dirname "$dest")/.$(basename "$dest").XXXXXX")
    cp "$src" "$tmp"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dest"
}

found_lib=0
while IFS= read -r -d '' f; do
    case "$f" in
        *.so) place "$f" "$pkglibdir/$(basename "$f")" 0755; found_lib=1 ;;
        *.control | *.sql) place "$f" "$extdir/$(basename "$f")" 0644 ;;
    esac
done < <(find "$out" -type f -print0)
[ "$found_lib" = 1 ] || { echo "install-ext: no library in $out" >&2; exit 1; }

for f in sql/tsoracle--*.sql; do
    name=$(basename "$f")
    # Base scripts only (tsoracle--X.sql); upgrade scripts (tsoracle--X--Y.sql) came with the package.
    [[ "$name" =~ ^tsoracle--[^-]+\.sql$ ]] && place "$f" "$extdir/$name" 0644
done
echo "installed tsoracle into $pkglibdir and $extdir" >&2
