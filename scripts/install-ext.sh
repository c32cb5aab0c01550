#!/usr/bin/env bash
# Install tsoracle into a PostgreSQL installation without harming a server that runs from
# it: the package is built first (scripts/build-ext.sh), then every file is copied to a
# temporary name beside its destination and renamed into place, as install(1) and dpkg do.
# A running server keeps the library it has mapped (the old file lives on until it closes
# it) and loads the new one at its next start; a library copied over in place would instead
# change under its feet (SIGBUS, SIGSEGV: the whole server restarts).
#
# Also installs the frozen install scripts of earlier versions (sql/tsoracle--X.sql), so
# that CREATE EXTENSION tsoracle VERSION 'X' followed by ALTER EXTENSION ... UPDATE works.
#
# Usage: scripts/install-ext.sh PG_CONFIG [DEST_PG_CONFIG]
#   Builds against PG_CONFIG and installs where DEST_PG_CONFIG (default PG_CONFIG) says:
#   the tests build against an installation and install into their private copy of it, so
#   that the tests and `make package` share one build. INSTALL_PROFILE=debug: a debug build.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_CONFIG=${1:?usage: install-ext.sh PG_CONFIG [DEST_PG_CONFIG]}
DEST_PG_CONFIG=${2:-$PG_CONFIG}
[ "$("$PG_CONFIG" --version)" = "$("$DEST_PG_CONFIG" --version)" ] ||
    { echo "install-ext: $PG_CONFIG and $DEST_PG_CONFIG are different versions" >&2; exit 1; }
out=$(scripts/build-ext.sh --for-install "$PG_CONFIG")

pkglibdir=$("$DEST_PG_CONFIG" --pkglibdir)
extdir="$("$DEST_PG_CONFIG" --sharedir)/extension"

# place SRC DEST: copy to a temporary file in DEST's directory, then rename over DEST.
place() {
    local src=$1 dest=$2 mode=$3 tmp
    install -d "$(dirname "$dest")"
    tmp=$(mktemp "$(dirname "$dest")/.$(basename "$dest").XXXXXX")
    cp "$src" "$tmp"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dest"
}

while IFS= read -r -d '' f; do
    case "$f" in
        *.so) place "$f" "$pkglibdir/$(basename "$f")" 0755 ;;
        *.control | *.sql) place "$f" "$extdir/$(basename "$f")" 0644 ;;
    esac
done < <(find "$out" -type f -print0)

for f in sql/tsoracle--*.sql; do
    name=$(basename "$f")
    # Base scripts only (tsoracle--X.sql); upgrade scripts (tsoracle--X--Y.sql) came with the package.
    [[ "$name" =~ ^tsoracle--[^-]+\.sql$ ]] && place "$f" "$extdir/$name" 0644
done
echo "installed tsoracle into $pkglibdir and $extdir" >&2
