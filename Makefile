# tsoracle — see README.md.
#
# PG_MAJOR selects the PostgreSQL major for `run`, `stop`, `install` and `bench` (default 15,
# Debian's); every supported major is listed in scripts/postgresql-versions, and
# scripts/pg-install.sh fetches the ones Debian does not have. `test` proves them all.
PG_MAJOR ?= 15
PG_MAJORS := 15 16 17 18
# What `make test` runs on every major: the #[pg_test]s and these integration suites ...
TEST_MAJORS ?= $(PG_MAJORS)
# (pooler: PgBouncer, postgres_exporter and promtool, about 15 s: cheap enough for every major;
# monitoring: the exporter set up as monitoring.md says, on Debian's pg_hba.conf, a few seconds.)
# (operations: the DBA's routine operations under load, each for QUICK_OPS_SECONDS on these
# majors and 15 s on the full ones; bluegreen: switchovers, pg_createsubscriber from 17 on.)
# (relay: tsoracle-relay through TLS, configured by its environment, its metrics and exit codes.)
QUICK_SUITES := foundation harness leases lease_concurrency sequences seq_in_place followers in_place_readers security clocks drops resolved pooler monitoring operations bluegreen relay
QUICK_OPS_SECONDS ?= 8
# ... and on the oldest and the newest, also the crash, failover and backup suites and a
# fleet (an oracle that fails over, members that restart).
FULL_MAJORS ?= 15 18
FULL_SUITES := $(QUICK_SUITES) replication backup patroni fleet fleet_runbooks fleet_runbooks_more fleet_resolved fleet_statements fleet_members fleet_size
# pg_repack on the extension's tables under load, on the majors whose pg_repack
# scripts/install-deps.sh --test installs (Debian's package: 15).
REPACK_MAJORS ?= 15
# pg_upgrade from upstream 15 (scripts/postgresql-versions says why not Debian's) to 18.
UPGRADE_FROM ?= 15-upstream
UPGRADE_TO ?= 18
PGRX_TEST_PGDATA ?= /tmp/tsoracle-pgrx-test
TEST_THREADS ?= 2
# The majors' integration tests are independent (each its own private installation, clusters
# on ports of their own): TEST_LANES of them run at once, the full majors first (the longest
# first: they end about together). Their builds take turns (flock): one target directory.
TEST_LANES ?= 2
# In /tmp (like the clusters the tests start), not in the work tree: the postgres OS user runs
# the binaries from there, whatever the permissions of the directories above the work tree.
# One copy per work tree and major: $(TEST_PG_ROOT)/pgNN.
TEST_PG_ROOT ?= /tmp/tsoracle-test-$(shell printf %s "$(CURDIR)" | md5sum | cut -c1-8)
TEST_PGRX_HOME ?= $(CURDIR)/target/pgrx-home
# $(call test_pg,MAJOR[,--install]): make the private copy of MAJOR's installation (with this
# tree's build in it if --install) and print its bin directory. The tests' build has the
# feature clock-fault (src/clock.rs: the wall clock of the whole server can be offset, so the
# suites step it under load); the packages and `make install` never do.
# It is built with the Cargo profile TEST_PROFILE (Cargo.toml: release without fat LTO, a
# quarter of the build time on every major); the packages are built with release.
TEST_FEATURES ?= clock-fault
TEST_PROFILE ?= tests
test_pg = INSTALL_PROFILE=$(TEST_PROFILE) TSORACLE_FEATURES=$(TEST_FEATURES) scripts/test-pg.sh $(2) $(1) $(TEST_PG_ROOT)/pg$(1) $(TEST_PGRX_HOME)/pg$(1)

.PHONY: run stop test test-core test-pg test-integration test-upgrade test-install test-package \
	test-snapshot test-untouched test-deps test-docs test-layers install deps build-deps \
	bench clean fmt lint package

## Build, install, start a local cluster with tsoracle preloaded, and show it working.
run: install
	PG_MAJOR=$(PG_MAJOR) scripts/run.sh

stop:
	PG_MAJOR=$(PG_MAJOR) scripts/run.sh stop

## Every test: formatting and clippy, the pure core, the #[pg_test]s inside PostgreSQL and the
## integration tests on every supported major, pg_upgrade, the Debian package.
## Before and after, scripts/untouched.sh checks that the tests wrote nothing into the
## installations servers run from and left `make run`'s demo servers running.
test: test-snapshot deps test-deps test-docs test-layers lint test-core test-pg test-integration \
	test-upgrade test-install test-package test-untouched

test-snapshot:
	mkdir -p target && scripts/untouched.sh snapshot target/untouched.before
test-untouched:
	scripts/untouched.sh check target/untouched.before

## What the tests need (every major, Patroni, etcd, sudo, PgBouncer, postgres_exporter,
## promtool), on top of the build dependencies.
deps:
	scripts/install-deps.sh --test

## What building and installing for PG_MAJOR needs, and nothing else.
build-deps:
	scripts/install-deps.sh $(PG_MAJOR)

# What each command installs: `make install` and `make run` the build dependencies of one
# major only (scripts/test-install-deps.sh).
test-deps:
	scripts/test-install-deps.sh

# Every path the manual and the design pages name exists; every relative link and anchor resolves;
# every path and heading the code's HINTs and messages name exists (test-hint-paths.py); the
# package version and the settings' defaults the docs state are the build's (test-doc-facts.py);
# README.md at most 15,000 bytes, BENCHMARKS.md and every docs/**/*.md 20,000, every .rs file at
# most 1,000 lines.
test-docs:
	python3 scripts/test-doc-paths.py
	python3 scripts/test-hint-paths.py --self-test
	python3 scripts/test-doc-facts.py --self-test
	python3 scripts/check-sizes.py

# src/ in layers (src/lib.rs): no import circle, every edge pointing down; the check itself first
# proves that it finds a circle and a layer violation.
test-layers:
	python3 scripts/check-layers.py --self-test
	python3 scripts/check-layers.py

# Built as a package, then renamed into place file by file: safe under a running server.
install: build-deps
	scripts/install-ext.sh "$$(scripts/pg-install.sh $(PG_MAJOR))/pg_config"

# (and the harness's own unit tests: the runbook pages' parser, tests/src/runbook.rs).
test-core:
	cargo test -p tsoracle-core -p tsoracle-relay
	cargo test -p tsoracle-tests --lib

# Every test runs against a private copy of the PostgreSQL installation (scripts/test-pg.sh):
# nothing a test builds is ever written where a user's server loads its library from.
test-pg: $(addprefix test-pg-,$(TEST_MAJORS))
test-pg-%: deps
	@echo "timing: test-pg-$* started at $$(date +%s)"
	$(call test_pg,$*) >/dev/null
	rm -rf $(PGRX_TEST_PGDATA)-$* && install -d -o postgres -g postgres $(PGRX_TEST_PGDATA)-$*
	PGRX_HOME=$(TEST_PGRX_HOME)/pg$* cargo pgrx test pg$* --runas postgres --pgdata $(PGRX_TEST_PGDATA)-$*
	@echo "timing: test-pg-$* ended at $$(date +%s)"

# The integration tests load the extension installed in the private copy, into clusters
# they start themselves from its binaries; first, the golden-output tests of the SQL surface
# (scripts/test-regress.sh, tests/pg_regress). Both run whatever the other's outcome.
# Each lane's output is printed whole when it ends (--output-sync).
test-integration: deps
	$(MAKE) --no-print-directory -j$(TEST_LANES) --output-sync=target \
		$(addprefix integration-,$(filter $(FULL_MAJORS),$(TEST_MAJORS)) $(filter-out $(FULL_MAJORS),$(TEST_MAJORS)))
test-integration-%: deps
	$(MAKE) --no-print-directory integration-$*
integration-%:
	@echo "timing: test-integration-$* started at $$(date +%s)"
	mkdir -p target && bin=$$(flock target/.build.lock env $(call test_pg,$*,--install)) && { \
	scripts/test-regress.sh "$$bin"; regress=$$?; \
	TSORACLE_PG_BIN="$$bin" $(if $(filter $*,$(FULL_MAJORS)),,TSORACLE_OPS_SECONDS=$(QUICK_OPS_SECONDS)) \
		cargo test --no-fail-fast -p tsoracle-tests \
		$(addprefix --test ,$(if $(filter $*,$(FULL_MAJORS)),$(FULL_SUITES),$(QUICK_SUITES)) \
			$(if $(filter $*,$(REPACK_MAJORS)),repack)) \
		-- --test-threads=$(TEST_THREADS); suites=$$?; \
	[ $$regress = 0 ] && [ $$suites = 0 ]; }
	@echo "timing: test-integration-$* ended at $$(date +%s)"

# Only the golden-output tests, on one major (the private copy, with this tree's build).
test-regress-%: deps
	bin=$$($(call test_pg,$*,--install)) && scripts/test-regress.sh "$$bin"

# pg_upgrade from the oldest to the newest supported major (tests/tests/upgrade.rs,
# upgrade_fleet.rs); a fleet upgraded from the previous release (scripts/previous-release,
# built from its commit by scripts/test-previous.sh) one cluster at a time, on the newest
# (upgrade_rolling.rs).
test-upgrade: deps
	old=$$(CARGO_TARGET_DIR=target/$(UPGRADE_FROM) $(call test_pg,$(UPGRADE_FROM),--install)) && \
	new=$$($(call test_pg,$(UPGRADE_TO),--install)) && \
	previous=$$(scripts/test-previous.sh $(UPGRADE_TO) $(TEST_PG_ROOT)/pg$(UPGRADE_TO)-previous $(TEST_PGRX_HOME)/pg$(UPGRADE_TO)-previous) && \
	TSORACLE_UPGRADE_FROM_BIN="$$old" TSORACLE_PREVIOUS_BIN="$$previous" TSORACLE_PG_BIN="$$new" \
		cargo test -p tsoracle-tests --test upgrade --test upgrade_fleet --test upgrade_rolling

# Installing a different build under load (tests/tests/install.rs), on PG_MAJOR.
test-install: deps
	sys=$$(scripts/pg-install.sh $(PG_MAJOR)) && \
	bin=$$($(call test_pg,$(PG_MAJOR),--install)) && \
	TSORACLE_BUILD_PG_CONFIG="$$sys/pg_config" TSORACLE_PG_BIN="$$bin" cargo test -p tsoracle-tests --test install

## Debian packages, one per supported major, in target/packages (scripts/package-deb.sh).
## It needs each major's build dependencies only (no Patroni, etcd, PgBouncer or Prometheus).
package:
	for m in $(PG_MAJORS); do scripts/install-deps.sh $$m && scripts/package-deb.sh $$m target/packages || exit 1; done

# The PostgreSQL 15 package installed with dpkg on this machine, the others' file lists.
test-package: package
	scripts/test-package.sh target/packages $(PG_MAJORS)

# The harness is scripts/bench/bench.py (its knobs at its top; report.py prints the report).
# The member section's hand-off floor (BENCHMARKS.md, "A member of a fleet"): these sources
# built with the feature handoff-floor (release, in a target directory of its own; never
# installed), run as a second member in the same run. Skipped with BENCH_ONLY without member.
# The distance section's link, tests/src/bin/tso-link.rs, release: skipped with BENCH_ONLY
# without distance.
FLOOR_TARGET ?= $(CURDIR)/target/floor
bench: install
	set -e; bin="$$(scripts/pg-install.sh $(PG_MAJOR))"; floor=""; \
	case " $${BENCH_ONLY:-member} " in *" member "*) \
		out=$$(CARGO_TARGET_DIR=$(FLOOR_TARGET) TSORACLE_FEATURES=handoff-floor scripts/build-ext.sh "$$bin/pg_config"); \
		floor=$$(find "$$out" -name tsoracle.so -print -quit) ;; \
	esac; \
	case " $${BENCH_ONLY:-distance} " in *" distance "*) \
		cargo build --release -p tsoracle-tests --bin tso-link ;; \
	esac; \
	BENCH_PG_BIN="$$bin" BENCH_FLOOR_SO="$$floor" BENCH_LINK="$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release/tso-link" \
		python3 scripts/bench/bench.py

clean:
	cargo clean

## Format every crate with rustfmt (settings in rustfmt.toml).
fmt:
	cargo fmt --all

## Formatting check, then clippy with warnings as errors on every crate and all its targets
## (lint levels in Cargo.toml's [workspace.lints]), the extension for the oldest and the newest
## major (src/compat.rs holds what differs between them). The extension needs pgrx (deps).
lint: deps
	cargo fmt --all -- --check
	cargo clippy -p tsoracle-core -p tsoracle-tests -p tsoracle-relay --all-targets -- -D warnings
	cargo clippy -p tsoracle --all-targets --no-default-features --features pg15 -- -D warnings
	cargo clippy -p tsoracle --all-targets --no-default-features --features pg18,clock-fault,handoff-floor -- -D warnings
