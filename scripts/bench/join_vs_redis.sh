#!/usr/bin/env bash
# Handoff speed, side by side: how fast a fourth node takes its share of 1,000,000 keys of
# 100 bytes, in slotring and in Redis Cluster, on this machine, in one run.
#
# slotring: a 3-node cluster (scripts/cluster.sh, release build), filled with `node bench
# --sequential` (every key written once, acknowledged by a majority), left until the nodes are
# quiet (the folds have put the fill into redb: snapshots are read from there, and the idle
# writer below must not run beside them), then a 4th node started with
# --join. Timed from the start of the 4th process until every leader reports no moving shard
# (`node rebalance --wait`: every shard's voters are placement's target), plus the time
# `node check` then takes to pass (every shard has 3 replicas, all nodes agree on the table,
# replicas at equal applied index hold equal state). Keys moved = the keys the 4th node then
# holds (its replicas' applied state). During the join a paced writer (`node bench --rate`)
# runs for 10 s from the joiner's start and its write p99 is compared with the same writer's
# on the idle cluster just before; the check runs after the writer's 10 s.
#
# Redis: a 3+3 cluster (defaults: appendonly no), filled with the same keys and values
# (scripts/bench/redis_fill.py), then a 7th node added as an empty primary (`redis-cli
# --cluster add-node`) and `redis-cli --cluster rebalance --cluster-use-empty-masters` timed.
# Keys moved = DBSIZE of the new primary afterwards.
#
# Prints keys/s for both and the ratio, and writes everything to
# scripts/bench/results/join_vs_redis-DATE-HHMM.txt. Installs redis with apt-get if missing.
#
# usage: scripts/bench/join_vs_redis.sh
#        KEYS=1000000 RATE=2000 SLOTRING_MAX_MOVES=4 SLOTRING_BASE_PORT=7600 REDIS_BENCH_PORT=7700
#        SLOTRING_NODE_BIN=PATH: that node binary, not a fresh release build
#        KEEP_LOGS=DIR: copy the four slotring nodes' logs there at the end (RUST_LOG applies)
#        WRITER_SECS=10: how long the paced writer runs for the join (it starts about a second
#            before the joiner)
#        SLOTRING_ONLY=1: skip Redis (for comparing two slotring builds, alternating)
#        POLL_MS=50: how often `node rebalance --wait` asks the nodes whether moves are left
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

KEYS=${KEYS:-1000000}
RATE=${RATE:-2000}
WRITER_SECS=${WRITER_SECS:-10}
POLL_MS=${POLL_MS:-50}
VALUE=100
SL_BASE=${SLOTRING_BASE_PORT:-7600}
REDIS_BASE=${REDIS_BENCH_PORT:-7700}
[[ $KEYS =~ ^[1-9][0-9]*$ && $RATE =~ ^[1-9][0-9]*$ && $WRITER_SECS =~ ^[1-9][0-9]*$ ]] ||
    { echo "KEYS, RATE and WRITER_SECS must be positive integers" >&2; exit 2; }
[[ $POLL_MS =~ ^[1-9][0-9]*$ ]] && ((POLL_MS >= 10 && POLL_MS <= 60000)) ||
    { echo "POLL_MS must be an integer from 10 to 60000" >&2; exit 2; }
# The joiner starts after the writer's first progress line, at about 1 s.
((WRITER_SECS >= 2)) || { echo "WRITER_SECS must be at least 2" >&2; exit 2; }
[[ -f .cluster/size ]] &&
    { echo "a cluster from scripts/cluster.sh already exists in .cluster: 'scripts/cluster.sh down --purge' first" >&2; exit 1; }

# shellcheck source=scripts/bench/redis_cluster.sh
source scripts/bench/redis_cluster.sh
source scripts/bench/slow_commits.sh
[[ -n ${SLOTRING_ONLY:-} ]] || redis_install

TARGET=${CARGO_TARGET_DIR:-target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
# SLOTRING_NODE_BIN: run that binary (an older build, say) instead of building one.
BIN=${SLOTRING_NODE_BIN:-$TARGET/release/node}
mkdir -p scripts/bench/results
OUT=scripts/bench/results/join_vs_redis-$(date +%F-%H%M).txt
WORK=$(mktemp -d "${TMPDIR:-/tmp}/join-vs-redis.XXXXXX")
SLOTRING_UP=
JOINER_PID=
WRITER_PID=

cleanup() {
    redis_down
    local pid
    for pid in $WRITER_PID $JOINER_PID; do
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n $SLOTRING_UP ]]; then
        keep_logs
        scripts/cluster.sh down --purge >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
}
# keep_logs: with KEEP_LOGS set, copies the slotring nodes' logs there.
keep_logs() {
    if [[ -n ${KEEP_LOGS:-} ]]; then
        mkdir -p "$KEEP_LOGS" && cp .cluster/n*.log "$WORK"/n3.log "$KEEP_LOGS"/ 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "$*" | tee -a "$OUT"; }
now() { date +%s.%N; }
# secs_since T0: seconds from T0 to now, 3 decimals.
secs_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
# node_ticks: the CPU time (user + system, in clock ticks) the running slotring nodes used.
node_ticks() {
    local total=0 pid fields
    for pid in $(cat .cluster/n*.pid 2>/dev/null); do
        [[ -r /proc/$pid/stat ]] || continue
        read -ra fields < <(sed 's/.*) //' "/proc/$pid/stat")
        total=$((total + fields[11] + fields[12]))
    done
    echo "$total"
}
# wait_quiet: polls until the nodes together used under a tenth of a core for a whole second
# (at least 5 s after the call, at most 120 s), and logs how long that took.
wait_quiet() {
    local start=$SECONDS before after hz
    hz=$(getconf CLK_TCK)
    sleep 5
    while ((SECONDS - start < 120)); do
        before=$(node_ticks)
        sleep 1
        after=$(node_ticks)
        if (((after - before) * 10 < hz)); then
            log "slotring quiet after $((SECONDS - start)) s (folds done)"
            return
        fi
    done
    log "slotring still busy after 120 s: measuring anyway"
}
# The interpreter itself, not a version manager's shim: a shim is a shell script that starts
# several processes per call, and the polling below calls python while the join runs.
PY=$(python3 -c 'import sys; print(sys.executable)')
# json_field FILE EXPR: a python expression over the JSON document `d` in FILE.
json_field() { "$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"; }

: >"$OUT"
log "join_vs_redis: $(date -Is), keys=$KEYS value=${VALUE}B paced writer=${RATE}/s max moves=${SLOTRING_MAX_MOVES:-4}"
log "node binary: $BIN"
log "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/^Mem:/ {print $2}') GiB"
log "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# ------------------------------------------------------------------------------------------
# slotring
[[ -n ${SLOTRING_NODE_BIN:-} ]] || cargo build --release -p node 2>&1 | tail -n 1
SLOTRING_NODE_BIN=$BIN SLOTRING_BASE_PORT=$SL_BASE scripts/cluster.sh up 3 >"$WORK/up.log" 2>&1 &
up_pid=$!
SLOTRING_UP=1
wait "$up_pid" || { cat "$WORK/up.log" >&2; exit 1; }
export SLOTRING_CERTS_DIR=$ROOT/.cluster/certs
SEED=127.0.0.1:$SL_BASE

log "== slotring: 3 nodes, filling $KEYS keys"
t0=$(now)
"$BIN" bench -a "$SEED" --sequential --keys "$KEYS" --requests "$KEYS" --clients 50 --pipeline 16 \
    --read-ratio 0 -o json >"$WORK/fill.json" 2>/dev/null
fill_ok=$(json_field "$WORK/fill.json" 'd["writes"]["ok"]')
log "slotring fill: $fill_ok of $KEYS writes acknowledged in $(secs_since "$t0") s"
[[ $fill_ok == "$KEYS" ]] || { echo "the fill lost writes" >&2; exit 1; }
# The folds put the fill into redb (snapshots are read from there) after it; the idle writer
# must not run beside them, or "idle" is the cluster still folding a million keys.
wait_quiet

# paced NAME SECS: the paced writer for SECS s in the background; its JSON lands in
# WORK/NAME.json.
paced() {
    "$BIN" bench -a "$SEED" --keys "$KEYS" --rate "$RATE" --duration "$2" --clients 50 \
        --read-ratio 0 -o json >"$WORK/$1.json" 2>"$WORK/$1.err" &
    WRITER_PID=$!
}
idle_from=$(now)
paced idle 10
wait "$WRITER_PID"
WRITER_PID=
idle_to=$(now)
idle_p99=$(json_field "$WORK/idle.json" 'd["writes"]["latency_ms"]["p99"]')
log "slotring idle: paced writer at $RATE/s: write p99 $idle_p99 ms"

"$BIN" certs issue n3 --certs-dir "$SLOTRING_CERTS_DIR" >/dev/null
# The writer is a foreground client already running when the join begins: the joiner starts
# once it has written for a second (its first progress line). Started together, the writer
# made its connections to the nodes during the first moves, and its first writes took 40-50
# ms (BENCHMARKS.md, issue 6, session 41). Its window has the same length either way.
during_from=$(now)
paced during "$WRITER_SECS"
deadline=$((SECONDS + 30))
until grep -q '^bench: [0-9]* s:' "$WORK/during.err" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "the paced writer did not start in 30 s" >&2; exit 1; }
    sleep 0.05
done
t0=$(now)
# In a session of its own, as scripts/cluster.sh starts the other three (setsid does not fork
# here, so $! is the node): with the kernel's autogroups, a node started from this script
# shared a CPU share with the paced writer, whose p99 it is meant to be measured against.
setsid "$BIN" --listen "127.0.0.1:$((SL_BASE + 3))" --join "$SEED" --node-id n3 \
    --data-dir "$WORK/n3" --certs-dir "$SLOTRING_CERTS_DIR" >"$WORK/n3.log" 2>&1 &
JOINER_PID=$!
# Until the moves have started (n3 is a member and some leader reports a moving shard): a
# `node status` every 0.1 s, for the first second or so of the join.
deadline=$((SECONDS + 600))
while :; do
    ((SECONDS < deadline)) || { echo "the moves did not start in 600 s" >&2; exit 1; }
    if "$BIN" status -a "$SEED" -o json >"$WORK/status.json" 2>/dev/null; then
        state=$(json_field "$WORK/status.json" \
            '"%d %d" % (len(d["moving"]), any(n["id"] == "n3" and n["state"] == "alive" for n in d["nodes"]))')
        read -r moving joined <<<"$state"
        ((joined && moving > 0)) && break
    fi
    sleep 0.1
done
# Then one `node rebalance --wait`, which asks every node every POLL_MS milliseconds over one
# connection each, until no leader reports a moving shard; done when `node check` then
# passes. (At its default of 250 ms it saw the end of the moves 0.1-0.26 s late, BENCHMARKS.md,
# issue 6, session 43; polling with a new CLI process and interpreter 10 times a second took
# 10-15% of this machine's two cores from the join, session 24.) The check is an audit of the
# moves, not one of them: it runs once the writer's window is over (when every node hashed
# all it held for a check, the writer's p99 was 119-170 ms with it in the window and 39-80 ms
# without, BENCHMARKS.md, issue 6, session 30; replicas now keep digests of their states, so
# a check hashes nothing), and the time it takes is added to the moves'.
check_took=0
while :; do
    ((SECONDS < deadline)) || { echo "the moves did not finish in 600 s" >&2; exit 1; }
    if "$BIN" rebalance -a "$SEED" --wait --poll-ms "$POLL_MS" \
        --wait-timeout $((deadline - SECONDS + 1)) -o json >"$WORK/rebalance.json" 2>/dev/null; then
        moves_took=$(secs_since "$t0")
        if [[ -n $WRITER_PID ]]; then
            wait "$WRITER_PID"
            WRITER_PID=
            during_to=$(now)
        fi
        check_t0=$(now)
        if "$BIN" check -a "$SEED" >"$WORK/check.txt" 2>&1; then
            check_took=$(secs_since "$check_t0")
            break
        fi
    fi
    sleep 0.1
done
took=$(awk -v a="$moves_took" -v b="$check_took" 'BEGIN { printf "%.3f", a + b }')
"$BIN" status -a "$SEED" -o json >"$WORK/status.json"
moved=$(json_field "$WORK/status.json" 'next(n["held"]["keys"] for n in d["nodes"] if n["id"] == "n3")')
shards=$(json_field "$WORK/status.json" 'next(n["held"]["shards"] for n in d["nodes"] if n["id"] == "n3")')
if [[ -n $WRITER_PID ]]; then
    wait "$WRITER_PID"
    WRITER_PID=
    during_to=$(now)
fi
during_p99=$(json_field "$WORK/during.json" 'd["writes"]["latency_ms"]["p99"]')
during_failed=$(json_field "$WORK/during.json" 'd["writes"]["ops"] - d["writes"]["ok"]')
SL_RATE=$(awk -v k="$moved" -v t="$took" 'BEGIN { printf "%.0f", k / t }')
log "slotring join: n3 holds $moved keys in $shards shards after $took s: $SL_RATE keys/s"
log "  (no move left after $moves_took s; node check, once the writer was done, passed in $check_took s)"
# A join of the 4th node must give it a copy of at least 3/4 of the shards (replication factor
# 3 over 4 nodes); each shard it gained is one move (a learner added, one old voter removed),
# and a 3 -> 4 join moves no copy between the old nodes (BENCHMARKS.md, "Balance and
# movement": 0.00 at N = 3), so the shards it holds are the shards moved.
spec_shards=$(json_field "$WORK/status.json" 'd["shards"]')
log "slotring shards moved: $shards, theoretical minimum $(((spec_shards * 3 + 3) / 4)):" \
    "$(awk -v a="$shards" -v m="$(((spec_shards * 3 + 3) / 4))" 'BEGIN { printf "%.3f", a / m }')×"
log "slotring during the join: paced writer at $RATE/s for $WRITER_SECS s: write p99 $during_p99 ms" \
    "($(awk -v a="$during_p99" -v b="$idle_p99" 'BEGIN { printf "%.2f", a / b }')× idle), $during_failed failed"
if ((during_failed > 0)); then
    log "  failed: $(json_field "$WORK/during.json" \
        '"unavailable %d, indeterminate %d, other %d; first error: %s" % (d["writes"]["unavailable"], d["writes"]["indeterminate"], d["writes"]["other"], d["first_error"])')"
fi
log "  retried (took more than one attempt): $(json_field "$WORK/during.json" \
    '"%d writes, p50 %s ms, p99 %s ms; answers %s" % (d["retried"]["ops"], d["retried"]["latency_ms"]["p50"], d["retried"]["latency_ms"]["p99"], d["retried"]["attempts"])')"
log "  slowest group commit a node logged (over 100 ms; 0: none) while the writer ran:" \
    "idle $(slowest_commit "$idle_from" "$idle_to" .cluster/n*.log) ms," \
    "during the join $(slowest_commit "$during_from" "$during_to" .cluster/n*.log "$WORK/n3.log") ms"
sed 's/^/  /' "$WORK/check.txt" >>"$OUT"
log "slotring joiner's peak resident memory: $(awk '/^VmHWM/ { printf "%.0f MB", $2 / 1024 }' "/proc/$JOINER_PID/status")"
kill "$JOINER_PID" 2>/dev/null || true
wait "$JOINER_PID" 2>/dev/null || true
JOINER_PID=
keep_logs
scripts/cluster.sh down --purge >/dev/null 2>&1
SLOTRING_UP=
if [[ -n ${SLOTRING_ONLY:-} ]]; then
    echo "results in $OUT"
    exit 0
fi

# ------------------------------------------------------------------------------------------
# Redis
log "== redis cluster (3 primaries + 3 replicas, defaults), $(redis-server --version | awk '{print $3}'): filling $KEYS keys"
redis_up "$WORK/redis" "appendonly no"
"$PY" scripts/bench/redis_fill.py "$REDIS_BASE" --keys "$KEYS" --value-size $VALUE | tee -a "$OUT"
NEW=$((REDIS_BASE + 6))
redis_start_node "$WORK/redis" "$NEW" "appendonly no"
redis-cli --cluster add-node "127.0.0.1:$NEW" "127.0.0.1:$REDIS_BASE" >"$WORK/add.log" 2>&1 ||
    { cat "$WORK/add.log" >&2; exit 1; }
# Every node knows all 7 (rebalance asks each primary to migrate to the new one by its id) and
# says cluster_state:ok (a new node answers CLUSTERDOWN for a few seconds after it joins).
all_know_seven() {
    local port info
    for port in $(seq "$REDIS_BASE" "$NEW"); do
        info=$(cli "$port" cluster info 2>/dev/null)
        [[ $info == *cluster_state:ok* && $info == *cluster_known_nodes:7* ]] || return 1
    done
    redis-cli --cluster check "127.0.0.1:$REDIS_BASE" >/dev/null 2>&1
}
t0=$(now)
deadline=$((SECONDS + 60))
until all_know_seven; do
    ((SECONDS < deadline)) || { echo "the new redis node did not join in 60 s" >&2; exit 1; }
    sleep 0.1
done
log "redis: the new node was usable (every node cluster_state:ok, 7 known) $(secs_since "$t0") s after add-node"

t0=$(now)
redis-cli --cluster rebalance "127.0.0.1:$REDIS_BASE" --cluster-use-empty-masters >"$WORK/rebalance.log" 2>&1 ||
    { cat "$WORK/rebalance.log" >&2; exit 1; }
took=$(secs_since "$t0")
moved=$(cli "$NEW" dbsize)
RD_RATE=$(awk -v k="$moved" -v t="$took" 'BEGIN { printf "%.0f", k / t }')
log "redis rebalance: the new primary holds $moved keys after $took s: $RD_RATE keys/s"
redis_down
log "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
log "keys/s moved, slotring / redis: $(awk -v a="$SL_RATE" -v b="$RD_RATE" 'BEGIN { printf "%.2f", a / b }')"
echo "results in $OUT"
