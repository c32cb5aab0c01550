#!/usr/bin/env bash
# Build the Debian package of tsoracle for one PostgreSQL major, laid out as Debian's own
# PostgreSQL extension packages are: `postgresql-<major>-tsoracle`, the library in
# /usr/lib/postgresql/<major>/lib, the control file and SQL scripts in
# /usr/share/postgresql/<major>/extension, depending on `postgresql-<major>`. The target
# machine needs no Rust: the package holds the built library.
#
# dpkg unpacks every file to a temporary name and renames it into place, so installing or
# upgrading the package under a running server is safe; the server loads the new library at
# its next restart (then ALTER EXTENSION tsoracle UPDATE moves each database's SQL objects
# to the new version).
#
# The operations examples go to /usr/share/doc/<package>/examples: the tested PgBouncer
# configuration, the postgres_exporter queries and the Prometheus alert rules (contrib/,
# docs/operations/pgbouncer.md and monitoring.md).
#
# Usage: scripts/package-deb.sh MAJOR OUTDIR     (prints the .deb's path)
set -euo pipefail
cd "$(dirname "$0")/.."

MAJOR=${1:?usage: package-deb.sh MAJOR OUTDIR}
OUTDIR=${2:?usage: package-deb.sh MAJOR OUTDIR}
PG_CONFIG="$(scripts/pg-install.sh "$MAJOR")/pg_config"
VERSION=$(sed -nE 's/^version = "([^"]+)"$/\1/p' Cargo.toml | head -n1)
[ -n "$VERSION" ] || { echo "package-deb: no version in Cargo.toml" >&2; exit 1; }
REVISION=1
ARCH=$(dpkg --print-architecture)
NAME=postgresql-$MAJOR-tsoracle

built=$(scripts/build-ext.sh "$PG_CONFIG")
stage=$(mktemp -d "${TMPDIR:-/tmp}/tsoracle-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
lib=$stage/usr/lib/postgresql/$MAJOR/lib
ext=$stage/usr/share/postgresql/$MAJOR/extension
doc=$stage/usr/share/doc/$NAME
install -d "$lib" "$ext" "$doc" "$doc/examples" "$stage/DEBIAN"

while IFS= read -r -d '' f; do
    case "$f" in
        *.so) install -m 0644 "$f" "$lib/" ;;
        *.control | *.sql) install -m 0644 "$f" "$ext/" ;;
    esac
done < <(find "$built" -type f -print0)
for f in sql/tsoracle--*.sql; do
    # The frozen install scripts of earlier versions (CREATE EXTENSION ... VERSION 'X').
    [[ "$(basename "$f")" =~ ^tsoracle--[^-]+\.sql$ ]] && install -m 0644 "$f" "$ext/"
done
install -m 0644 LICENSE "$doc/copyright"
install -m 0644 CHANGELOG.md "$doc/changelog"
gzip -9n "$doc/changelog"
install -m 0644 contrib/pgbouncer/pgbouncer.ini contrib/prometheus/queries.yaml \
    contrib/prometheus/tsoracle-alerts.yml "$doc/examples/"

# The shared libraries the library links against, as package dependencies.
libc_version=$(dpkg-query -W -f='${Version}' libc6 | sed -E 's/-.*//')
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: $NAME
Source: tsoracle
Version: $VERSION-$REVISION
Architecture: $ARCH
Maintainer: tsoracle developers <tsoracle@localhost>
Installed-Size: $size
Depends: postgresql-$MAJOR, libc6 (>= $libc_version), libgcc-s1, libpq5
Section: database
Priority: optional
Description: timestamp oracle and durable sequence allocator for PostgreSQL $MAJOR
 tsoracle issues 64-bit timestamps that are strictly increasing across
 backends, restarts, crashes and failover (tso_next), gapless durable blocks of
 named counters (tso_seq), and leases with a safe frontier.
 .
 Add tsoracle to shared_preload_libraries, restart the server, then
 CREATE EXTENSION tsoracle in the database named by tsoracle.database.
CONTROL

mkdir -p "$OUTDIR"
deb="$OUTDIR/${NAME}_${VERSION}-${REVISION}_${ARCH}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >&2
echo "$deb"
