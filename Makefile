# tsoracle — see README.md.
PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
PGRX_TEST_PGDATA ?= /tmp/tsoracle-pgrx-test
TEST_THREADS ?= 2
# In /tmp (like the clusters the tests start), not in the work tree: the postgres OS user runs
# the binaries from there, whatever the permissions of the directories above the work tree.
# One copy per work tree.
TEST_PG_ROOT ?= /tmp/tsoracle-pg15-test-$(shell printf %s "$(CURDIR)" | md5sum | cut -c1-8)
TEST_PGRX_HOME ?= $(CURDIR)/target/pgrx-home

.PHONY: run stop test test-core test-pg test-pg-install test-integration install deps bench clean fmt lint

## Build, install, start a local cluster with tsoracle preloaded, and show it working.
run: install
	scripts/run.sh

stop:
	@if [ -s .run/pgdata/PG_VERSION ]; then runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D .run/pgdata -m fast -w stop || true; fi

## Every test: formatting and clippy, the pure core, the #[pg_test]s inside PostgreSQL, the
## integration tests.
test: deps lint test-core test-pg test-integration

deps:
	scripts/install-deps.sh

# Built as a package, then renamed into place file by file: safe under a running server.
install: deps
	scripts/install-ext.sh $(PG_CONFIG)

test-core:
	cargo test -p tsoracle-core

# Every test runs against a private copy of the PostgreSQL installation (scripts/test-pg.sh):
# nothing a test builds is ever written where a user's server loads its library from.
test-pg-install: deps
	scripts/test-pg.sh $(TEST_PG_ROOT) $(TEST_PGRX_HOME)

test-pg: test-pg-install
	rm -rf $(PGRX_TEST_PGDATA) && install -d -o postgres -g postgres $(PGRX_TEST_PGDATA)
	PGRX_HOME=$(TEST_PGRX_HOME) cargo pgrx test pg15 --runas postgres --pgdata $(PGRX_TEST_PGDATA)

# The integration tests load the extension installed in the private copy, into clusters
# they start themselves from its binaries.
test-integration: test-pg-install
	scripts/install-ext.sh $(TEST_PG_ROOT)/usr/lib/postgresql/15/bin/pg_config
	TSORACLE_PG_BIN=$(TEST_PG_ROOT)/usr/lib/postgresql/15/bin cargo test -p tsoracle-tests -- --test-threads=$(TEST_THREADS)

bench: install
	scripts/bench.sh

clean:
	cargo clean

## Format every crate with rustfmt (settings in rustfmt.toml).
fmt:
	cargo fmt --all

## Formatting check, then clippy with warnings as errors on every crate and all its targets
## (lint levels in Cargo.toml's [workspace.lints]). The extension needs pgrx initialised (deps).
lint: deps
	cargo fmt --all -- --check
	cargo clippy -p tsoracle-core -p tsoracle-tests --all-targets -- -D warnings
	cargo clippy -p tsoracle --all-targets --features pg15 -- -D warnings
