#!/usr/bin/env bash
# Build tsoracle for the PostgreSQL that PG_CONFIG names (cargo pgrx package picks the pgNN
# feature from its version) and print the directory holding the result: the library, the
# control file and the install and upgrade scripts, under the paths PG_CONFIG reports.
#
# Usage: scripts/build-ext.sh [--for-install] PG_CONFIG   (INSTALL_PROFILE=debug for a debug
#   build, or the name of another Cargo profile, such as the tests' one;
#   TSORACLE_FEATURES=clock-fault for the tests' build, whose wall clock can be offset;
#   TSORACLE_FEATURES=handoff-floor for make bench's hand-off floor, whose member answers
#   tso_next() without its oracle: refused with --for-install, a build to install or package)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --for-install ]; then
    shift
    case ",${TSORACLE_FEATURES:-}," in
    *,handoff-floor,*)
        echo "build-ext: the feature handoff-floor is for make bench only (its member answers without the oracle): never installed or packaged" >&2
        exit 1
        ;;
    esac
fi
PG_CONFIG=${1:?usage: build-ext.sh [--for-install] PG_CONFIG}
profile=${INSTALL_PROFILE:-release}
case "$profile" in
release) profile_flag=() ;;
debug) profile_flag=(--debug) ;;
*) profile_flag=(--profile "$profile") ;;
esac
profile_dir=$profile
major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
out="${CARGO_TARGET_DIR:-target}/$profile_dir/tsoracle-pg$major"
rm -rf "$out"
feature_flag=()
[ -z "${TSORACLE_FEATURES:-}" ] || feature_flag=(--features "$TSORACLE_FEATURES")
cargo pgrx package "${profile_flag[@]}" "${feature_flag[@]}" --pg-config "$PG_CONFIG" --out-dir "$out" >&2
[ -n "$(find "$out" -name tsoracle.so -print -quit)" ] || { echo "build-ext: no library in $out" >&2; exit 1; }
echo "$out"
