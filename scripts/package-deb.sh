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
# The relay (relay/, docs/operations/relay.md) is a binary package of its own, `tsoracle-relay`,
# the same for every major (a libpq client, no server library): /usr/bin/tsoracle-relay, the
# systemd unit tsoracle-relay@.service (contrib/systemd/, one instance per
# /etc/tsoracle/relay/NAME.conf), an example configuration, and a system user tsoracle-relay
# (home /var/lib/tsoracle-relay) made by its postinst. Built by every call (the same file for
# every major: cargo builds it once).
#
# Usage: scripts/package-deb.sh MAJOR OUTDIR     (prints the .debs' paths, one a line)
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

built=$(scripts/build-ext.sh --for-install "$PG_CONFIG")
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

# ---- tsoracle-relay
RELAY=tsoracle-relay
relay_deb="$OUTDIR/${RELAY}_${VERSION}-${REVISION}_${ARCH}.deb"
cargo build --release --locked -p tsoracle-relay >&2
relay_bin="${CARGO_TARGET_DIR:-target}/release/tsoracle-relay"
relay_version=$("$relay_bin" --version | awk '{print $2}')
[ "$relay_version" = "$VERSION" ] || { echo "package-deb: tsoracle-relay is $relay_version, the package $VERSION (relay/Cargo.toml)" >&2; exit 1; }
rstage=$(mktemp -d "${TMPDIR:-/tmp}/tsoracle-relay-deb.XXXXXX")
chmod 0755 "$rstage"
trap 'rm -rf "$stage" "$rstage"' EXIT
rdoc=$rstage/usr/share/doc/$RELAY
install -d "$rstage/usr/bin" "$rstage/lib/systemd/system" "$rstage/etc/tsoracle/relay" \
    "$rdoc/examples" "$rstage/DEBIAN"
install -m 0755 "$relay_bin" "$rstage/usr/bin/tsoracle-relay"
strip --strip-unneeded "$rstage/usr/bin/tsoracle-relay"
install -m 0644 "contrib/systemd/tsoracle-relay@.service" "$rstage/lib/systemd/system/"
install -m 0644 contrib/systemd/relay.conf "$rdoc/examples/"
install -m 0644 docs/operations/relay.md "$rdoc/"
install -m 0644 LICENSE "$rdoc/copyright"
install -m 0644 CHANGELOG.md "$rdoc/changelog"
gzip -9n "$rdoc/changelog"
# The system user the unit runs as; its home holds ~/.pgpass and ~/.postgresql/ for libpq.
cat >"$rstage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent passwd tsoracle-relay >/dev/null; then
        adduser --system --group --quiet --home /var/lib/tsoracle-relay tsoracle-relay
    fi
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
    fi
fi
POSTINST
cat >"$rstage/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
POSTRM
chmod 0755 "$rstage/DEBIAN/postinst" "$rstage/DEBIAN/postrm"
rsize=$(du -sk --exclude=DEBIAN "$rstage" | cut -f1)
cat >"$rstage/DEBIAN/control" <<CONTROL
Package: $RELAY
Source: tsoracle
Version: $VERSION-$REVISION
Architecture: $ARCH
Maintainer: tsoracle developers <tsoracle@localhost>
Installed-Size: $rsize
Depends: libc6 (>= $libc_version), libgcc-s1, libpq5, adduser
Section: database
Priority: optional
Description: reads a tsoracle fleet's outboxes in one order, exactly once
 tsoracle-relay emits every committed row of every cluster's outbox of a
 tsoracle fleet exactly once, in the fleet's timestamp order, up to the
 fleet's resolved timestamp, to a file it resumes. It connects with libpq
 (TLS, passfiles, service files, several hosts) and serves Prometheus
 metrics. Run one per configuration file with the systemd unit
 tsoracle-relay@NAME (/etc/tsoracle/relay/NAME.conf).
CONTROL
dpkg-deb --root-owner-group --build "$rstage" "$relay_deb" >&2
echo "$relay_deb"
