#!/usr/bin/env bash
# Measures failover time on a local cluster (scripts/cluster.sh, 127.0.0.1 only): each round
# SIGKILLs the leader of one shard and times, from the kill, how long until every surviving
# node names another leader for it; then restarts the killed node and waits until every node
# lists all members alive again. Prints each round and min / median / max in milliseconds.
# It signals nodes only through scripts/cluster.sh, which signals only the PIDs it recorded.
#
# usage: scripts/bench/failover.sh [NODES=5] [ROUNDS=5] [SHARD=42]
set -euo pipefail
cd "$(dirname "$0")/../.."

NODES=${1:-5}
ROUNDS=${2:-5}
SHARD=${3:-42}
DEADLINE_SECONDS=30
CLUSTER=scripts/cluster.sh
CERTS=$PWD/.cluster/certs
TARGET=${CARGO_TARGET_DIR:-target}
case $TARGET in /*) ;; *) TARGET=$PWD/$TARGET ;; esac
BIN=$TARGET/release/node

for value in "$NODES" "$ROUNDS" "$SHARD"; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "usage: $0 [NODES] [ROUNDS] [SHARD]" >&2; exit 2; }
done
((NODES >= 2 && ROUNDS >= 1)) || { echo "failover needs 2 nodes and 1 round" >&2; exit 2; }

"$CLUSTER" up "$NODES" >/dev/null
BASE=$(cat .cluster/base_port)

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# The leader id node I names for SHARD, or nothing when it does not answer.
leader_seen_by() {
    local json
    json=$(timeout 5 "$BIN" shard-info "$SHARD" -a "127.0.0.1:$((BASE + $1))" -o json \
        --certs-dir "$CERTS" 2>/dev/null) || return 0
    json=${json#*\"leader\"}
    json=${json%%\}*}
    sed -nE 's/.*"id"[[:space:]]*:[[:space:]]*"([^"]*)".*/\1/p' <<<"$json"
}

# Whether every node but DEAD names a leader other than DEAD.
all_moved() {
    local dead=$1 index seen
    for ((index = 0; index < NODES; index++)); do
        ((index == dead)) && continue
        seen=$(leader_seen_by "$index")
        [[ -n $seen && $seen != "n$dead" ]] || return 1
    done
}

# Whether every node lists NODES members, all alive.
all_alive() {
    local index json
    for ((index = 0; index < NODES; index++)); do
        json=$(timeout 5 "$BIN" members -a "127.0.0.1:$((BASE + index))" -o json \
            --certs-dir "$CERTS" 2>/dev/null) || return 1
        (($(grep -oE '"state"[[:space:]]*:[[:space:]]*"alive"' <<<"$json" | wc -l) == NODES)) ||
            return 1
    done
}

results=()
for ((round = 1; round <= ROUNDS; round++)); do
    leader=$(leader_seen_by 0)
    [[ $leader =~ ^n([0-9]+)$ ]] || { echo "no leader for shard $SHARD: '$leader'" >&2; exit 1; }
    victim=${BASH_REMATCH[1]}
    "$CLUSTER" kill "$victim" >/dev/null
    killed=$(now_ms)
    until all_moved "$victim"; do
        (($(now_ms) - killed < DEADLINE_SECONDS * 1000)) ||
            { echo "round $round: no failover within ${DEADLINE_SECONDS}s" >&2; exit 1; }
        sleep 0.02
    done
    elapsed=$(($(now_ms) - killed))
    results+=("$elapsed")
    echo "round $round: killed n$victim (leader of shard $SHARD), every survivor moved on in ${elapsed} ms"

    "$CLUSTER" restart "$victim" >/dev/null
    started=$(now_ms)
    until all_alive; do
        (($(now_ms) - started < DEADLINE_SECONDS * 1000)) ||
            { echo "round $round: n$victim not back within ${DEADLINE_SECONDS}s" >&2; exit 1; }
        sleep 0.1
    done
done

printf '%s\n' "${results[@]}" | sort -n | awk -v shard="$SHARD" -v rounds="$ROUNDS" -v nodes="$NODES" '
    { v[NR] = $1 }
    END {
        median = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "failover of shard %s over %d rounds, %d nodes: min %d ms, median %g ms, max %d ms\n",
            shard, rounds, nodes, v[1], median, v[NR]
    }'

