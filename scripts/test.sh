#!/usr/bin/env bash
# The test command: installs what the checks need (rustfmt, clippy, iproute2, nftables), then
# format check, clippy (warnings are errors), the node binary, and all tests of the workspace
# (unit, property, virtual-network and multi-process), always with the committed Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo fmt --version >/dev/null 2>&1; then rustup component add rustfmt; fi
if ! cargo clippy --version >/dev/null 2>&1; then rustup component add clippy; fi
# The partition test (cluster-tests, partition.rs) runs a cluster in a network namespace of its
# own and cuts it there with nftables: it needs `ip` (iproute2), `nft` (nftables) and root. It
# fails, rather than skips, without them.
missing=()
if ! command -v ip >/dev/null 2>&1; then missing+=(iproute2); fi
if ! command -v nft >/dev/null 2>&1; then missing+=(nftables); fi
if ((${#missing[@]} > 0)); then
  echo "== apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" || { apt-get update -q && apt-get install -y -q "${missing[@]}"; }
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo build -p node (the multi-process tests run this binary)"
cargo build --locked -p node
echo "== cargo test"
cargo test --workspace --all-targets --locked
echo "== doc tests"
cargo test --workspace --doc --locked
