#!/usr/bin/env bash
# The test command: installs what the checks need, then format check, clippy (warnings are
# errors), and all tests of the workspace, always with the committed Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo fmt --version >/dev/null 2>&1; then rustup component add rustfmt; fi
if ! cargo clippy --version >/dev/null 2>&1; then rustup component add clippy; fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --all-targets --locked
echo "== doc tests"
cargo test --workspace --doc --locked
