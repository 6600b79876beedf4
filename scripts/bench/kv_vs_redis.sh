#!/usr/bin/env bash
# Key-value throughput, slotring next to Redis Cluster in one run on this machine.
#
# slotring: a 3-node cluster from scripts/cluster.sh (release build, RF 3, 127.0.0.1:BASE..),
# measured with `node bench` (100000 keys, 100-byte values, 50 clients): SET unpipelined,
# GET unpipelined, GET pipelined ×16, SET pipelined ×16, then SET paced at half the SET ×16
# median (`--rate`, for the p99-at-half-load target) (in that order); each RUNS times for
# DURATION seconds after one discarded warm-up run. A slotring write is acknowledged once a majority of its
# shard's 3 replicas have it fsynced (write-ahead log, fdatasync, group commit); a GET is
# linearizable (ReadIndex on the leader). Then a fresh cluster with `--danger-lease-reads`
# (PROTOCOL.md R9): GET unpipelined and ×16 again, answered under the leader's lease
# (linearizable while the nodes' clocks keep rates within 1%).
#
# Redis: a Redis Cluster of 3 primaries + 3 replicas on 127.0.0.1:REDIS_BASE.. (Debian's
# redis-server, installed with apt-get if missing), measured the same way:
#   (a) defaults (appendonly no, no RDB saves): `redis-benchmark --cluster` SET and GET, 50
#       clients, -r 100000 -d 100, unpipelined and -P 16; -n is calibrated from a short run so
#       each run lasts about DURATION seconds. Redis acknowledges before replicating or
#       fsyncing anything.
#   (b) equal durability: a fresh cluster with appendonly yes + appendfsync always, every SET
#       followed by WAIT 1 1000 (scripts/bench/redis_wait_bench.py: raw RESP, 50 connections
#       over 5 processes), DURATION seconds, RUNS times.
# Each figure is the median of the RUNS runs (each column on its own). Prints a table with the
# ratios slotring / Redis and writes everything to scripts/bench/results/kv_vs_redis-DATE-HHMM.txt.
# Cleans up what it started (the slotring nodes by the PIDs cluster.sh recorded, the Redis
# servers by their PIDs), also on failure.
#
# usage: scripts/bench/kv_vs_redis.sh
#        DURATION=10 RUNS=3 SLOTRING_BASE_PORT=7600 REDIS_BENCH_PORT=7700
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

DURATION=${DURATION:-10}
RUNS=${RUNS:-3}
SL_BASE=${SLOTRING_BASE_PORT:-7600}
REDIS_BASE=${REDIS_BENCH_PORT:-7700}
CLIENTS=50
KEYS=100000
VALUE=100
[[ $DURATION =~ ^[0-9]+$ && $RUNS =~ ^[1-9][0-9]*$ ]] ||
    { echo "DURATION and RUNS must be positive integers" >&2; exit 2; }
[[ -f .cluster/size ]] &&
    { echo "a cluster from scripts/cluster.sh already exists in .cluster: 'scripts/cluster.sh down --purge' first" >&2; exit 1; }

# shellcheck source=scripts/bench/redis_cluster.sh
source scripts/bench/redis_cluster.sh
redis_install

TARGET=${CARGO_TARGET_DIR:-target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
BIN=$TARGET/release/node
mkdir -p scripts/bench/results
OUT=scripts/bench/results/kv_vs_redis-$(date +%F-%H%M).txt
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kv-vs-redis.XXXXXX")
SLOTRING_UP=

cleanup() {
    redis_down
    if [[ -n $SLOTRING_UP ]]; then
        scripts/cluster.sh down --purge >/dev/null 2>&1 || true
        SLOTRING_UP=
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "$*" | tee -a "$OUT"; }

# median of the numbers on stdin
median() {
    sort -g | awk '{ v[++n] = $1 } END {
        if (!n) { print "nan"; exit }
        print (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }'
}

declare -A RESULT=() # "system/row/metric" -> median

# record SYSTEM ROW FILE: FILE holds one "ops_per_s p50_ms p99_ms" line per run.
record() {
    local system=$1 row=$2 file=$3 i metric
    i=1
    for metric in ops p50 p99; do
        RESULT[$system/$row/$metric]=$(awk -v i=$i '{ print $i }' "$file" | median)
        ((i++))
    done
    log "$system $row: median of $(wc -l <"$file") runs: ${RESULT[$system/$row/ops]} ops/s," \
        "p50 ${RESULT[$system/$row/p50]} ms, p99 ${RESULT[$system/$row/p99]} ms"
}

: >"$OUT"
log "kv_vs_redis: $(date -Is), DURATION=${DURATION}s RUNS=$RUNS clients=$CLIENTS keys=$KEYS value=${VALUE}B"
log "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/^Mem:/ {print $2}') GiB"
log "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# ------------------------------------------------------------------------------------------
# slotring
cargo build --release -p node 2>&1 | tail -n 1
SLOTRING_NODE_BIN=$BIN SLOTRING_BASE_PORT=$SL_BASE scripts/cluster.sh up 3 >"$WORK/up.log" 2>&1 &
up_pid=$!
SLOTRING_UP=1
wait "$up_pid" || { cat "$WORK/up.log" >&2; exit 1; }
export SLOTRING_CERTS_DIR=$ROOT/.cluster/certs
SEED=127.0.0.1:$SL_BASE

# sl_bench NAME FLAGS...: a warm-up run, then RUNS runs of `node bench -o json`.
sl_bench() {
    local name=$1 run json
    shift
    "$BIN" bench -a "$SEED" --duration 3 --clients $CLIENTS --keys $KEYS --value-size $VALUE \
        "$@" -o json >/dev/null 2>&1 || true
    : >"$WORK/sl-$name"
    for ((run = 1; run <= RUNS; run++)); do
        json=$("$BIN" bench -a "$SEED" --duration "$DURATION" --clients $CLIENTS --keys $KEYS \
            --value-size $VALUE "$@" -o json 2>>"$WORK/bench.log") || true
        [[ -n $json ]] || tail -n 3 "$WORK/bench.log" >>"$OUT"
        python3 - "$name" "$run" "$json" >>"$WORK/sl-$name" 2>>"$OUT" <<'EOF'
import json, sys
name, run, text = sys.argv[1], sys.argv[2], sys.argv[3]
if not text.strip():
    print(f'  slotring {name} run {run}: node bench printed nothing (see below)', file=sys.stderr)
    sys.exit(0)
d = json.loads(text)
row = d.get("all") or d.get("writes") or d.get("reads")
lat = row["latency_ms"]
# ok operations per second: failed ones are not throughput.
print(f'{row["ok_per_s"]:.1f} {lat["p50"]} {lat["p99"]}')
print(f'  slotring {name} run {run}: {row["ok_per_s"]:.0f} ok/s, p50 {lat["p50"]} ms, '
      f'p99 {lat["p99"]} ms, p99.9 {lat["p999"]} ms, unavailable {row["unavailable"]}, '
      f'indeterminate {row["indeterminate"]}, other {row["other"]}, '
      f'first error {d["first_error"]}', file=sys.stderr)
EOF
    done
    record slotring "$name" "$WORK/sl-$name"
}

log "== slotring: 3 nodes, RF 3, $("$BIN" --version)"
sl_bench set_p1 --read-ratio 0 --pipeline 1
sl_bench get_p1 --read-ratio 1 --pipeline 1
# The load generator runs on one thread (its default, like redis-benchmark's) except for the
# pipelined rows, where 800 operations in flight keep a second thread busy.
sl_bench get_p16 --read-ratio 1 --pipeline 16 --threads 2
sl_bench set_p16 --read-ratio 0 --pipeline 16 --threads 2
# Write latency at half the maximum write throughput (the SET -P 16 median), paced open-loop
# (`--rate`: latency counts from each operation's due time).
HALF=$(awk -v ops="${RESULT[slotring/set_p16/ops]}" 'BEGIN { printf "%d", ops / 2 }')
if ((HALF > 0)); then
    sl_bench set_half --read-ratio 0 --pipeline 16 --threads 2 --rate "$HALF"
    log "  (set_half: paced at $HALF writes/s, half of the set_p16 median)"
fi
log "load after slotring: $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/cluster.sh down --purge >/dev/null 2>&1
SLOTRING_UP=

# The same cluster with R9's opt-in leases (`--danger-lease-reads`): GETs only (writes do not
# change).
SLOTRING_DANGER_LEASE_READS=true SLOTRING_NODE_BIN=$BIN SLOTRING_BASE_PORT=$SL_BASE \
    scripts/cluster.sh up 3 >"$WORK/up.log" 2>&1 &
up_pid=$!
SLOTRING_UP=1
wait "$up_pid" || { cat "$WORK/up.log" >&2; exit 1; }
log "== slotring with --danger-lease-reads"
sl_bench get_p1_lease --read-ratio 1 --pipeline 1
sl_bench get_p16_lease --read-ratio 1 --pipeline 16 --threads 2
scripts/cluster.sh down --purge >/dev/null 2>&1
SLOTRING_UP=

# ------------------------------------------------------------------------------------------
# Redis Cluster

# rb_csv TEST PIPELINE N: one redis-benchmark run; prints "rps p50_ms p99_ms".
rb_csv() {
    redis-benchmark --cluster -h 127.0.0.1 -p "$REDIS_BASE" -c $CLIENTS -r $KEYS -d $VALUE \
        -t "$1" -P "$2" -n "$3" --csv 2>/dev/null |
        awk -F'","' -v t="${1^^}" '$1 == "\"" t { print $2, $5, $7 }'
}

# rb_bench NAME TEST PIPELINE: calibrates -n for about DURATION s, then RUNS runs.
rb_bench() {
    local name=$1 test=$2 pipeline=$3 rps n run line
    rps=$(rb_csv "$test" "$pipeline" $((pipeline * 20000)) | awk '{ print int($1) }')
    [[ -n $rps && $rps -gt 0 ]] || { echo "redis-benchmark $test -P $pipeline failed" >&2; return 1; }
    n=$((rps * DURATION))
    : >"$WORK/rd-$name"
    for ((run = 1; run <= RUNS; run++)); do
        line=$(rb_csv "$test" "$pipeline" "$n")
        [[ -n $line ]] || { echo "redis-benchmark $test -P $pipeline -n $n failed" >&2; return 1; }
        echo "$line" >>"$WORK/rd-$name"
        echo "  redis $name run $run: -n $n: $line (ops/s p50 p99)" >>"$OUT"
    done
    record redis "$name" "$WORK/rd-$name"
}

log "== redis cluster (3 primaries + 3 replicas), defaults: appendonly no, no saves; $(redis-server --version | awk '{print $3}')"
redis_up "$WORK/defaults" "appendonly no"
rb_bench set_p1 set 1
rb_bench set_p16 set 16
rb_bench get_p1 get 1
rb_bench get_p16 get 16
redis_down

log "== redis cluster, appendonly yes + appendfsync always, each SET followed by WAIT 1 1000"
redis_up "$WORK/durable" "appendonly yes
appendfsync always"
: >"$WORK/rd-wait"
for ((run = 0; run <= RUNS; run++)); do
    line=$(python3 scripts/bench/redis_wait_bench.py "$REDIS_BASE" --clients $CLIENTS \
        --duration "$([[ $run == 0 ]] && echo 3 || echo "$DURATION")" --keys $KEYS --value-size $VALUE)
    ((run == 0)) && continue # warm-up
    echo "  redis set_wait run $run: $line" >>"$OUT"
    awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
           print v["writes_per_s"], v["p50_ms"], v["p99_ms"] }' <<<"$line" >>"$WORK/rd-wait"
done
record redis set_wait "$WORK/rd-wait"
redis_down
log "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# ------------------------------------------------------------------------------------------
# The table
{
    echo
    printf '%-34s | %-28s | %-28s | %s\n' "row (50 clients, 100 B, 100k keys)" \
        "slotring ops/s  p50   p99 ms" "redis ops/s  p50   p99 ms" "slotring/redis ops/s"
    row() {
        local label=$1 ours=$2 theirs=$3
        awk -v l="$label" -v a="${RESULT[slotring/$ours/ops]}" -v ap="${RESULT[slotring/$ours/p50]}" \
            -v aq="${RESULT[slotring/$ours/p99]}" -v b="${RESULT[redis/$theirs/ops]}" \
            -v bp="${RESULT[redis/$theirs/p50]}" -v bq="${RESULT[redis/$theirs/p99]}" 'BEGIN {
            printf "%-34s | %9.0f %7.2f %8.2f  | %9.0f %7.2f %8.2f  | %.3f\n", l, a, ap, aq, b, bp, bq, (b > 0 ? a / b : 0)
        }'
    }
    row "SET, redis defaults" set_p1 set_p1
    row "SET -P 16, redis defaults" set_p16 set_p16
    row "GET, redis defaults" get_p1 get_p1
    row "GET -P 16, redis defaults" get_p16 get_p16
    row "GET, leases, redis defaults" get_p1_lease get_p1
    row "GET -P 16, leases, redis defaults" get_p16_lease get_p16
    row "SET, equal durability (WAIT 1)" set_p1 set_wait
    row "SET -P 16 vs redis WAIT 1" set_p16 set_wait
    row "SET at half max (paced) vs WAIT 1" set_half set_wait
} | tee -a "$OUT"
echo "results in $OUT"
