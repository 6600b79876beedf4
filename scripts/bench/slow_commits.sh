# The nodes' slow group commits, for the benchmark scripts that must tell a disk that stalled
# from the thing they measure (failover.sh, join_vs_redis.sh). Source it; it defines one
# function and runs nothing.

# slowest_commit FROM TO LOG...: the slowest group commit (write-ahead log append and
# fdatasync), in ms, that the node logs LOG... report as slow (`slow group commit`, over
# 100 ms) between unix times FROM and TO (seconds, fractions allowed), or 0 if none. A node
# warns as a slow commit ends, but at most once a second: a slow commit within a second of a
# warning is named only by the node's next warning, if any, so it can be missed or counted
# late. Every write waits for a group commit on a majority, so a large figure in a window
# where every shard's writes stalled at once points at the disk, not at what was measured.
slowest_commit() {
    local from=$1 to=$2
    shift 2
    # No slow commit (grep finds nothing) is an answer, not a failure under `pipefail`.
    { grep -h -F "slow group commit" "$@" 2>/dev/null || true; } |
        sed -n 's/^\([^ ]*\) .*slowest_ms=\([0-9]*\).*/\1 \2/p' |
        while read -r stamp slowest; do
            echo "$(date -d "$stamp" +%s.%N) $slowest"
        done |
        awk -v a="$from" -v b="$to" '$1 >= a && $1 <= b && $2 > max { max = $2 }
            END { print max + 0 }'
}
