#!/usr/bin/env bash
# Failure detection, slotring next to Redis Cluster in one run on this machine: ROUNDS kill -9s
# of shard 42's leader on 5 local slotring nodes (scripts/bench/failover.sh: time until every
# survivor's shard-info names the next replica), then ROUNDS kill -9s of a Redis Cluster primary
# (3+3, cluster-node-timeout 1000; scripts/bench/redis_failover.sh: time until every survivor
# flags it failed, and until a write is accepted). Prints both summaries and the ratios of the
# medians; the full output goes to scripts/bench/results/failover-vs-redis-DATE.txt.
#
# usage: scripts/bench/failover_vs_redis.sh [ROUNDS=10]
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${1:-10}
mkdir -p scripts/bench/results
OUT=scripts/bench/results/failover-vs-redis-$(date +%F).txt

{
    echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
    echo "== slotring"
    scripts/bench/failover.sh 5 "$ROUNDS" 42
    scripts/cluster.sh down --purge >/dev/null
    echo "== redis cluster"
    scripts/bench/redis_failover.sh "$ROUNDS"
} 2>&1 | tee "$OUT"

ours=$(sed -n 's/^failover of shard .* median \([0-9.]*\) ms.*/\1/p' "$OUT")
flag=$(sed -n 's/^flag_ms .*median=\([0-9.]*\).*/\1/p' "$OUT")
write=$(sed -n 's/^write_ms .*median=\([0-9.]*\).*/\1/p' "$OUT")
awk -v ours="$ours" -v flag="$flag" -v write="$write" 'BEGIN {
    printf "slotring median %g ms; redis flags the node failed at %g ms (%.2fx slower), accepts a write at %g ms (%.2fx)\n",
        ours, flag, flag / ours, write, write / ours
}' | tee -a "$OUT"
