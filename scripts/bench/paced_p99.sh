#!/usr/bin/env bash
# Write p99 at a fixed rate, the figure behind issue 5's "p99 at half load" target, comparable
# between two builds. Starts a fresh 3-node cluster with scripts/cluster.sh (127.0.0.1 only),
# runs `node bench` at full load for WARMUP seconds (so the write-ahead log reaches its steady
# state, with segments being reused, and the fold thread has folded), then RUNS runs of
# 8 seconds at RATE writes/s (`--rate`: open loop, latency counted from each write's due
# time), prints each run's p99 and their median, and stops the cluster it started.
#
# usage: scripts/bench/paced_p99.sh [RATE=2000] [RUNS=5] [WARMUP=25]
#        SLOTRING_NODE_BIN: the node binary (default: scripts/cluster.sh's release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-2000}
RUNS=${2:-5}
WARMUP=${3:-25}
for value in "$RATE" "$RUNS" "$WARMUP"; do
    [[ $value =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [RATE] [RUNS] [WARMUP]" >&2; exit 2; }
done
scripts/cluster.sh up 3 >/dev/null
trap 'scripts/cluster.sh down --purge >/dev/null 2>&1 || true' EXIT
BIN=$(cat .cluster/bin)
export SLOTRING_CERTS_DIR=$PWD/.cluster/certs
ADDR=127.0.0.1:$(cat .cluster/base_port)
warm=$("$BIN" bench -a "$ADDR" --duration "$WARMUP" -o json)
python3 -c 'import json,sys; d=json.loads(sys.argv[1])["writes"]; print("warm-up: %.0f writes/s at full load, p99 %s ms" % (d["ok_per_s"], d["latency_ms"]["p99"]))' "$warm"
p99s=()
for ((i = 0; i < RUNS; i++)); do
    run=$("$BIN" bench -a "$ADDR" --duration 8 --rate "$RATE" -o json)
    p99s+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["writes"]["latency_ms"]["p99"])' "$run")")
done
printf '%s\n' "${p99s[@]}" | sort -g | awk -v rate="$RATE" -v bin="$BIN" '
    { v[NR] = $1; all = all " " $1 }
    END { printf "%s at %d writes/s: p99 (ms):%s; median %s\n", bin, rate, all, v[int((NR + 1) / 2)] }'
