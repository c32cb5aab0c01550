#!/usr/bin/env bash
# `make test`: what each set-up command installs (scripts/install-deps.sh --print, which the
# real install goes through the same list for). `make install` / `make run` for one major
# install that major's build dependencies only: no Patroni, no etcd, no sudo, no PgBouncer, no
# postgres_exporter or Prometheus, no other major; `make test` adds them. Prints one line per
# check and a closing count.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
passed=0 failed=0
check() {
    local what=$1
    shift
    if "$@"; then passed=$((passed + 1)); echo "ok: $what"; else failed=$((failed + 1)); echo "FAILED: $what"; fi
}
has() { grep -qx "$2" <<<"$1"; }
lacks() { ! grep -qx "$2" <<<"$1"; }
count() { grep -c "$2" <<<"$1"; }

b15=$("$HERE/install-deps.sh" --print 15)
b18=$("$HERE/install-deps.sh" --print 18)
t=$("$HERE/install-deps.sh" --print --test)
pooler="pgbouncer prometheus-postgres-exporter prometheus"
for p in patroni etcd-server etcd-client sudo patchelf $pooler; do
    check "make install PG_MAJOR=15 does not install $p" lacks "$b15" "package $p"
done
for p in patroni etcd-server sudo postgresql-15 postgresql-server-dev-15 $pooler; do
    check "make install PG_MAJOR=18 does not install $p" lacks "$b18" "package $p"
done
check "make install PG_MAJOR=15 installs PostgreSQL 15 and its headers" \
    bash -c "grep -qx 'package postgresql-server-dev-15' <<<'$b15' && grep -qx 'postgresql 15' <<<'$b15'"
check "make install PG_MAJOR=15 installs no other major" test "$(count "$b15" '^postgresql ')" = 1
check "make install PG_MAJOR=18 installs PostgreSQL 18 (and patchelf for it) only" \
    bash -c "grep -qx 'postgresql 18' <<<'$b18' && grep -qx 'package patchelf' <<<'$b18' && [ \$(grep -c '^postgresql ' <<<'$b18') = 1 ]"
check "make install (15 and 18) installs libpq, which a member connects to its oracle with" \
    bash -c "grep -qx 'package libpq-dev' <<<'$b15' && grep -qx 'package libpq-dev' <<<'$b18'"
for p in patroni etcd-server etcd-client sudo patchelf postgresql-server-dev-15 $pooler; do
    check "make test installs $p" has "$t" "package $p"
done
check "make test installs every supported major" \
    test "$(count "$t" '^postgresql ')" = "$(awk '$0 !~ /^#/ && $1 ~ /^[0-9]+$/' "$HERE/postgresql-versions" | wc -l)"
check "make test installs pg_repack for Debian's PostgreSQL 15" has "$t" "package postgresql-15-repack"
pkg=$(make -s -n -C "$HERE/.." package 2>/dev/null)
check "make package installs each major's build dependencies only (no Patroni, etcd, PgBouncer, Prometheus)" \
    bash -c "grep -q 'install-deps.sh' <<<'$pkg' && ! grep -q -- '--test' <<<'$pkg' && ! grep -qE '^make.* deps' <<<'$pkg'"

# An install touches nothing it did not bring: a host's own Debian cluster 15/main, running
# before, is still running afterwards, the same postmaster (its start time unchanged).
if command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q '^15 *main '; then
    started_here=0
    if ! pg_lsclusters -h | grep -q '^15 *main .*online'; then
        pg_ctlcluster 15 main start && started_here=1
    fi
    pid_file=$(pg_lsclusters -h | awk '$1 == 15 && $2 == "main" {print $6}')/postmaster.pid
    before=$(sed -n 1,3p "$pid_file" 2>/dev/null | tr '\n' ' ')
    "$HERE/install-deps.sh" 15 >/dev/null && "$HERE/install-deps.sh" --test >/dev/null
    after=$(sed -n 1,3p "$pid_file" 2>/dev/null | tr '\n' ' ')
    check "install-deps.sh (15, --test) leaves a running 15/main cluster running, the same postmaster" \
        bash -c "pg_lsclusters -h | grep -q '^15 *main .*online' && [ -n '$before' ] && [ '$before' = '$after' ]"
    ((started_here)) && pg_ctlcluster 15 main stop
else
    check "Debian's cluster 15/main exists to try the install against" false
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
