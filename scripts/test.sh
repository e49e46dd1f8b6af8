#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run): the prerequisites (each missing one
# named with its fix), formatting, clippy with warnings as errors, then every test.
# Arguments go to `cargo test` (e.g. `scripts/test.sh -- voice::` while working on voice).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/check-prerequisites.sh
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked "$@"
