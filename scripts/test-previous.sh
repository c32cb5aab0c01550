#!/usr/bin/env bash
# The previous release of tsoracle (scripts/previous-release), built from its commit in this
# repository's history by its own scripts, exactly as it shipped, and installed into a private
# PostgreSQL installation of its own (scripts/test-pg.sh of that release): the older side of
# a fleet upgraded one cluster at a time (tests/tests/upgrade_rolling.rs, `make
# test-upgrade`). Prints that installation's bin directory.
#
# Its source is extracted once into target/previous-<version>/src (git archive), and built in
# target/previous-<version>/target, apart from this tree's builds.
#
# Usage: scripts/test-previous.sh MAJOR ROOT PGRX_HOME
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
MAJOR=${1:?usage: test-previous.sh MAJOR ROOT PGRX_HOME}
ROOT=${2:?usage: test-previous.sh MAJOR ROOT PGRX_HOME}
PGRX_HOME_DIR=${3:?usage: test-previous.sh MAJOR ROOT PGRX_HOME}

read -r version commit < <(grep -v '^#' "$HERE/previous-release")
if ! git -C "$REPO" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "test-previous: commit $commit (tsoracle $version) is not in this repository's history: a full clone is needed (git fetch --unshallow)" >&2
    exit 2
fi
dir=$REPO/target/previous-$version
if [ "$(cat "$dir/src/.commit" 2>/dev/null)" != "$commit" ]; then
    rm -rf "$dir/src"
    mkdir -p "$dir/src"
    git -C "$REPO" archive "$commit" | tar -x -C "$dir/src"
    echo "$commit" > "$dir/src/.commit"
fi
echo "tsoracle $version ($commit) for the rolling upgrade test" >&2
CARGO_TARGET_DIR=$dir/target INSTALL_PROFILE=${INSTALL_PROFILE:-tests} TSORACLE_FEATURES= \
    "$dir/src/scripts/test-pg.sh" --install "$MAJOR" "$ROOT" "$PGRX_HOME_DIR"
