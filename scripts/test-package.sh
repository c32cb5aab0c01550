#!/usr/bin/env bash
# Test the Debian packages `make package` built (run as root):
#   - every package's metadata and file list: named postgresql-<major>-tsoracle, depends on
#     postgresql-<major>, holds the library (never a build with the feature handoff-floor),
#     control file and every install and upgrade script under Debian's PostgreSQL paths, the
#     operations examples of contrib/ (the same bytes) in its doc directory, and nothing else;
#   - the relay's package, tsoracle-relay: its metadata (depends on libpq5), its file list (the
#     binary, the systemd unit and the example configuration of contrib/systemd/, the same
#     bytes, and its docs), the binary runs (--version), and where systemd-analyze exists,
#     `systemd-analyze verify` accepts an instance of the unit with nothing to say (in a copy
#     of the system's units with the package unpacked over it: nothing is installed);
#   - the package for the system's PostgreSQL 15 is installed with `dpkg -i`, a fresh cluster
#     (on a free loopback port, from /usr/lib/postgresql/15/bin) preloads it, CREATE EXTENSION
#     works and tso_next() serves increasing timestamps; then `dpkg -r` removes every file.
# tsoracle files already in the system installation (a `make install`) are set aside first
# and renamed back into place at the end, so a `make run` demo server is left as it was (dpkg
# itself renames files into place: a running server keeps the library it has mapped).
#
# Usage: scripts/test-package.sh DIR MAJOR...
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: test-package.sh DIR MAJOR...}
shift
VERSION=$(sed -nE 's/^version = "([^"]+)"$/\1/p' Cargo.toml | head -n1)
ARCH=$(dpkg --print-architecture)
failures=0
# The operations examples every package ships (scripts/package-deb.sh).
EXAMPLES="contrib/pgbouncer/pgbouncer.ini contrib/prometheus/queries.yaml contrib/prometheus/tsoracle-alerts.yml"
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# Every script of sql/ (frozen base scripts and upgrades) and the current version's.
expected_sql() {
    { for f in sql/tsoracle--*.sql; do basename "$f"; done; echo "tsoracle--$VERSION.sql"; } | sort -u
}

for major in "$@"; do
    name=postgresql-$major-tsoracle
    deb=$DIR/${name}_${VERSION}-1_${ARCH}.deb
    if [ ! -f "$deb" ]; then fail "$deb missing"; continue; fi
    [ "$(dpkg-deb -f "$deb" Package)" = "$name" ] && ok "$name: Package" || fail "$name: Package is $(dpkg-deb -f "$deb" Package)"
    [ "$(dpkg-deb -f "$deb" Version)" = "$VERSION-1" ] && ok "$name: Version" || fail "$name: Version"
    dpkg-deb -f "$deb" Depends | grep -qE "(^|, )postgresql-$major(,|$)" && ok "$name: depends on postgresql-$major" ||
        fail "$name: Depends is '$(dpkg-deb -f "$deb" Depends)'"
    files=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {print $6}' | sed 's|^\./|/|' | sort)
    want=$( {
        echo "/usr/lib/postgresql/$major/lib/tsoracle.so"
        echo "/usr/share/postgresql/$major/extension/tsoracle.control"
        expected_sql | sed "s|^|/usr/share/postgresql/$major/extension/|"
        echo "/usr/share/doc/$name/copyright"
        echo "/usr/share/doc/$name/changelog.gz"
        for f in $EXAMPLES; do echo "/usr/share/doc/$name/examples/$(basename "$f")"; done
    } | sort)
    if [ "$files" = "$want" ]; then ok "$name: file list"; else
        fail "$name: file list differs:"; diff <(echo "$want") <(echo "$files") >&2 || true
    fi
    # The library was built for this major (its magic block records the major).
    tmp=$(mktemp -d); dpkg-deb -x "$deb" "$tmp"
    so=$tmp/usr/lib/postgresql/$major/lib/tsoracle.so
    # Read whole first: `nm | grep -q` under pipefail fails when grep exits before nm is done.
    syms=$(nm -D --defined-only "$so" 2>/dev/null || true)
    if grep -q ' Pg_magic_func$' <<<"$syms"; then ok "$name: library has a magic block"; else fail "$name: no Pg_magic_func in the library"; fi
    # Never the build for make bench's hand-off floor (its member answers without the oracle).
    if grep -qa 'built with the feature handoff-floor' "$so"; then fail "$name: the library was built with the feature handoff-floor"; else ok "$name: library built without handoff-floor"; fi
    for f in $EXAMPLES; do
        if cmp -s "$f" "$tmp/usr/share/doc/$name/examples/$(basename "$f")"; then ok "$name: examples/$(basename "$f") is $f"; else fail "$name: examples/$(basename "$f") differs from $f"; fi
    done
    rm -rf "$tmp"
done

# ---- the relay's package
relay=tsoracle-relay
rdeb=$DIR/${relay}_${VERSION}-1_${ARCH}.deb
UNIT="contrib/systemd/tsoracle-relay@.service"
if [ ! -f "$rdeb" ]; then fail "$rdeb missing"; else
    [ "$(dpkg-deb -f "$rdeb" Package)" = "$relay" ] && ok "$relay: Package" || fail "$relay: Package"
    [ "$(dpkg-deb -f "$rdeb" Version)" = "$VERSION-1" ] && ok "$relay: Version" || fail "$relay: Version"
    dpkg-deb -f "$rdeb" Depends | grep -qE "(^|, )libpq5(,|$)" && ok "$relay: depends on libpq5" ||
        fail "$relay: Depends is '$(dpkg-deb -f "$rdeb" Depends)'"
    files=$(dpkg-deb -c "$rdeb" | awk '$1 !~ /^d/ {print $6}' | sed 's|^\./|/|' | sort)
    want=$(printf '%s\n' /usr/bin/tsoracle-relay "/lib/systemd/system/$(basename "$UNIT")" \
        /usr/share/doc/$relay/copyright /usr/share/doc/$relay/changelog.gz \
        /usr/share/doc/$relay/relay.md /usr/share/doc/$relay/examples/relay.conf | sort)
    if [ "$files" = "$want" ]; then ok "$relay: file list"; else
        fail "$relay: file list differs:"; diff <(echo "$want") <(echo "$files") >&2 || true
    fi
    tmp=$(mktemp -d); dpkg-deb -x "$rdeb" "$tmp"
    for pair in "$UNIT:lib/systemd/system/$(basename "$UNIT")" \
        "contrib/systemd/relay.conf:usr/share/doc/$relay/examples/relay.conf" \
        "docs/operations/relay.md:usr/share/doc/$relay/relay.md"; do
        if cmp -s "${pair%%:*}" "$tmp/${pair#*:}"; then ok "$relay: /${pair#*:} is ${pair%%:*}"; else fail "$relay: /${pair#*:} differs from ${pair%%:*}"; fi
    done
    v=$("$tmp/usr/bin/tsoracle-relay" --version 2>&1 || true)
    [ "$v" = "tsoracle-relay $VERSION" ] && ok "$relay: --version says $v" || fail "$relay: --version says '$v'"
    if command -v systemd-analyze >/dev/null; then
        # A root of the system's units with the package over it; verify returns 0 even for
        # unknown keys, so anything it says is a failure.
        root=$(mktemp -d)
        mkdir -p "$root/lib/systemd"
        cp -a /lib/systemd/system "$root/lib/systemd/"
        cp -a "$tmp/." "$root/"
        if said=$(systemd-analyze verify --root="$root" tsoracle-relay@example.service 2>&1) && [ -z "$said" ]; then
            ok "$relay: systemd-analyze verify tsoracle-relay@example.service"
        else
            fail "$relay: systemd-analyze verify: $said"
        fi
        rm -rf "$root"
    else
        echo "skip: $relay: systemd-analyze verify (no systemd-analyze on this machine)"
    fi
    rm -rf "$tmp"
fi

# ---- dpkg -i of the PostgreSQL 15 package, a fresh cluster, dpkg -r
major=15
name=postgresql-$major-tsoracle
deb=$DIR/${name}_${VERSION}-1_${ARCH}.deb
BIN=/usr/lib/postgresql/$major/bin
LIB=/usr/lib/postgresql/$major/lib
EXT=/usr/share/postgresql/$major/extension
work=$(mktemp -d /tmp/tsoracle-pkgtest.XXXXXX)
chmod 755 "$work"
saved=$work/saved
mkdir -p "$saved"
# Set aside what `make install` put there (not owned by any package).
for f in "$LIB/tsoracle.so" "$EXT"/tsoracle*; do [ -e "$f" ] && cp -a "$f" "$saved/"; done
restore() {
    set +e
    if [ -s "$work/data/PG_VERSION" ]; then runuser -u postgres -- "$BIN/pg_ctl" -D "$work/data" -m immediate -w stop >/dev/null 2>&1; fi
    dpkg-query -W "$name" >/dev/null 2>&1 && dpkg -r "$name" >/dev/null
    for f in "$saved"/*; do
        [ -e "$f" ] || continue
        case "$(basename "$f")" in *.so) dest=$LIB ;; *) dest=$EXT ;; esac
        tmpf=$(mktemp "$dest/.$(basename "$f").XXXXXX") && cp -a "$f" "$tmpf" && mv -f "$tmpf" "$dest/$(basename "$f")"
    done
    rm -rf "$work"
}
trap restore EXIT

if dpkg -i "$deb" >/dev/null; then ok "dpkg -i $(basename "$deb")"; else fail "dpkg -i $deb"; exit 1; fi
dpkg -L "$name" | grep -qx "$LIB/tsoracle.so" && ok "dpkg -L lists $LIB/tsoracle.so" || fail "dpkg -L $name"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
chown postgres:postgres "$work"
scripts/init-cluster.sh "$BIN" "$work/data" "$port" "$work"
runuser -u postgres -- "$BIN/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null
psql=("$BIN/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1)
"${psql[@]}" -c "CREATE EXTENSION tsoracle"
state=""
for _ in $(seq 1 300); do
    state=$("${psql[@]}" -c "SELECT state FROM tso_status()") && [ "$state" = serving ] && break
    sleep 0.1
done
[ "$state" = serving ] && ok "the packaged extension serves" || fail "tso_status().state is '$state'"
read -r a b < <("${psql[@]}" -F ' ' -c "SELECT tso_next(), tso_next()")
if [ -n "$a" ] && [ "$b" -gt "$a" ] && [ "$a" -gt 0 ]; then ok "tso_next() = $a then $b"; else fail "tso_next() gave '$a' then '$b'"; fi
installed=$("${psql[@]}" -c "SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'")
[ "$installed" = "$VERSION" ] && ok "extension version $installed" || fail "extension version '$installed'"
runuser -u postgres -- "$BIN/pg_ctl" -D "$work/data" -m fast -w stop >/dev/null
if dpkg -r "$name" >/dev/null; then ok "dpkg -r $name"; else fail "dpkg -r $name"; fi
left=$(ls "$LIB/tsoracle.so" "$EXT"/tsoracle* 2>/dev/null || true)
[ -z "$left" ] && ok "dpkg -r removed every file" || fail "left after dpkg -r: $left"

if [ "$failures" = 0 ]; then echo "test-package: all checks passed"; else echo "test-package: $failures checks failed" >&2; exit 1; fi
