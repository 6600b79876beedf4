#!/usr/bin/env bash
# Failover, slotring next to Redis Cluster in one run on this machine: ROUNDS kill -9s of shard
# 42's leader on 5 local slotring nodes (scripts/bench/failover.sh: time from the kill to the
# first acknowledged write to that shard, from a `node probe` writing every 10 ms; also SWIM's
# down detection, when every survivor names the new leader, and how long writes to other
# shards failed), ROUNDS more with the shard idle before the kill and its probe started right
# after it (IDLE=1), then ROUNDS kill -9s of a Redis Cluster primary (3+3, cluster-node-timeout
# 1000; scripts/bench/redis_failover.sh: time until every survivor flags it failed, until a
# write to its slot is accepted, and how long writes to another primary's slot failed). Prints
# both summaries, the machine's load before and after, and the comparison of the medians; the
# full output goes to scripts/bench/results/failover-vs-redis-DATE-HHMM.txt.
#
# usage: scripts/bench/failover_vs_redis.sh [ROUNDS=10]
#        SLOTRING_BASE_PORT (default 7000) and REDIS_BENCH_PORT (default 7700) move the two
#        clusters' ports; SLOTRING_NODE_BIN names a prebuilt node binary.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${1:-10}
[[ $ROUNDS =~ ^[0-9]+$ ]] && ((ROUNDS >= 1)) || { echo "usage: $0 [ROUNDS=10]" >&2; exit 2; }
mkdir -p scripts/bench/results
OUT=scripts/bench/results/failover-vs-redis-$(date +%F-%H%M).txt
for ((n = 2; n < 100; n++)); do
    [[ -e $OUT ]] || break
    OUT=scripts/bench/results/failover-vs-redis-$(date +%F)-$n.txt
done

{
    echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -sr)"
    echo "load before: $(uptime)"
    echo "== slotring ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- node cluster || echo ', modified'))"
    # A fresh cluster each time: the figures depend on what the shards already hold.
    scripts/cluster.sh down --purge >/dev/null
    scripts/bench/failover.sh 5 "$ROUNDS" 42
    echo "== slotring, shard 42 idle until the kill"
    scripts/cluster.sh down --purge >/dev/null
    IDLE=1 scripts/bench/failover.sh 5 "$ROUNDS" 42
    scripts/cluster.sh down --purge >/dev/null
    echo "load between: $(uptime)"
    echo "== redis cluster"
    scripts/bench/redis_failover.sh "$ROUNDS"
    echo "load after: $(uptime)"
} 2>&1 | tee "$OUT"

median() { sed -n "s/^$1.*median[ =]\([0-9.]*\).*/\1/p" "$OUT"; }
ours_write=$(median 'slotring write_ms')
idle_write=$(median 'slotring idle write_ms')
ours_other=$(median 'slotring other_ms')
ours_hit=$(median 'slotring other_hit')
flag=$(median 'flag_ms ')
write=$(median 'write_ms ')
other=$(median 'other_blocked_ms ')
awk -v ow="$ours_write" -v iw="$idle_write" -v oo="$ours_other" -v oh="$ours_hit" -v f="$flag" \
    -v w="$write" -v o="$other" 'BEGIN {
    printf "kill -9 -> first acknowledged write (median of the rounds): slotring %g ms, redis %g ms;" \
        " redis/slotring %.2fx (slotring/redis %.2f); target: slotring <= 700 ms: %s\n",
        ow, w, w / ow, ow / w, ow <= 700 ? "met" : "NOT met"
    printf "  the same with shard 42 idle until the kill: slotring %g ms; redis/slotring %.2fx;" \
        " target: %s\n", iw, w / iw, iw <= 700 ? "met" : "NOT met"
    printf "redis flags the primary failed at %g ms (median)\n", f
    printf "writes to other shards/slots failing (median of the rounds): slotring, the longest" \
        " of up to 16 sampled shards: %g ms (median %g shards hit); redis, another primary'"'"'s" \
        " slot: %g ms\n", oo, oh, o
}' | tee -a "$OUT"
