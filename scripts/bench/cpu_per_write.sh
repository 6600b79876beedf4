#!/usr/bin/env bash
# CPU cost of a replicated write: runs `node bench` against the local cluster of
# scripts/cluster.sh (started by `scripts/cluster.sh up 3` first) and divides the CPU time the
# node processes used during the run (user + system, from /proc/PID/stat) by the operations
# done. Prints the bench's table and "nodes: X us of CPU per operation (all nodes together)".
# A figure that, unlike throughput, depends little on what else the machine runs.
#
# usage: scripts/bench/cpu_per_write.sh [node bench flags...]   e.g. --duration 10 --pipeline 16
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=$PWD/.cluster
[[ -f $DIR/size ]] || { echo "no cluster: run 'scripts/cluster.sh up 3' first" >&2; exit 1; }
BIN=${SLOTRING_NODE_BIN:-$(cat "$DIR/bin" 2>/dev/null || echo "$PWD/target/release/node")}
export SLOTRING_CERTS_DIR=$DIR/certs

pids=()
for ((i = 0; i < $(<"$DIR/size"); i++)); do
    pids+=("$(<"$DIR/n$i.pid")")
done
ticks=$(getconf CLK_TCK)

# Sum of utime + stime (fields 14 and 15 of /proc/PID/stat) over the nodes, in ticks.
cpu_ticks() {
    local total=0 pid fields
    for pid in "${pids[@]}"; do
        read -ra fields < <(sed 's/.*) //' "/proc/$pid/stat")
        total=$((total + fields[11] + fields[12]))
    done
    echo "$total"
}

before=$(cpu_ticks)
json=$("$BIN" bench -a "127.0.0.1:$(<"$DIR/base_port")" "$@" -o json)
after=$(cpu_ticks)
python3 - "$json" "$((after - before))" "$ticks" <<'EOF'
import json, sys
d, used, ticks = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
row = d.get("all") or d.get("writes") or d.get("reads")
lat = row["latency_ms"]
print(f'{row["ok"]} ok in {d["elapsed_s"]:.1f} s: {row["ok_per_s"]:.0f} ok/s, p50 {lat["p50"]} ms, '
      f'p99 {lat["p99"]} ms; failed: unavailable {row["unavailable"]}, '
      f'indeterminate {row["indeterminate"]}, other {row["other"]}')
ops = max(row["ops"], 1)
print(f'nodes: {used / ticks:.2f} s of CPU, {used / ticks / ops * 1e6:.0f} us of CPU per operation '
      f'(all nodes together)')
EOF
