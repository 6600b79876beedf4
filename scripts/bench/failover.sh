#!/usr/bin/env bash
# Measures failover on a local cluster (scripts/cluster.sh, 127.0.0.1 only). Each round:
#   - finds the actual leader of SHARD and of shards 0..31 (the node whose own replica says it
#     leads), and picks up to 16 of those shards led by another node ("other shards");
#   - starts two `node probe`s through a node that will survive (n0, or n1 when n0 is the
#     victim): one writing a key of SHARD every 10 ms, one writing a key of each other shard
#     every 50 ms, each write given 200 ms; waits until every key is being written and no
#     write has failed for 2 s (the previous round's restart moves shards back for a while);
#   - looks at the leaders again (a node that came back takes shards over for a few seconds):
#     if SHARD's leader moved, the round starts over; other shards now led by the victim are
#     left out of the round's figures;
#   - SIGKILLs SHARD's leader with scripts/cluster.sh kill, taking t0 in unix ms right before the
#     call (the signal lands a few ms later, inside that script: those ms count against us); a
#     round in which SHARD's writes never fail (its leader moved just before the kill) starts
#     over too;
#   - write_ms: t0 until the first acknowledged write to SHARD after its outage (the issue's
#     measure);
#   - down_ms: t0 until the first survivor logs the victim "member down" (SWIM);
#   - elect_ms: t0 until every survivor's `shard-info SHARD` names another leader (a sweep
#     spawns one CLI process per survivor, a few ms each);
#   - other shards: over the 4 s after t0, how many of them had writes failing and the longest
#     time one of them failed (other_ms; 0 if none did); and how long writes to SHARD failed
#     again after its first acknowledged write (again_ms);
#   - disk_ms: the slowest group commit a survivor logged as slow (over 100 ms) in those 4 s,
#     0 if none (scripts/bench/slow_commits.sh): when every shard stalls at once, this tells a
#     disk that stalled (under another process's writes, say) from a failover that did;
#   then stops the probes, restarts the killed node, and waits until every node lists all
#   members alive and SHARD's replicas agree on its leader. Prints each round, then min /
#   median / max of each figure in ms. The probes' JSON lines are kept in .cluster/probe-*.jsonl.
# It signals nodes only through scripts/cluster.sh, which signals only the PIDs it recorded,
# and probes only by the PIDs it started.
#
# usage: scripts/bench/failover.sh [NODES=5] [ROUNDS=5] [SHARD=42]
#        SLOTRING_NODE_BIN: the node binary (default $CARGO_TARGET_DIR/release/node)
#        PROBE_VERBOSE=1: the probes also log every write (event "write")
#        IDLE=1: nothing writes SHARD before the kill (its leader has gone idle: heartbeats every
#        1 s, followers wait t_elect + 1 s or for SWIM); its probe starts right after the
#        kill, as redis_failover.sh's write loop does
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/slow_commits.sh

NODES=${1:-5}
ROUNDS=${2:-5}
SHARD=${3:-42}
DEADLINE_SECONDS=30
WATCH_MS=4000
IDLE=${IDLE:-}
QUIET_MS=2000
QUIET_SECONDS=90
SCAN_SHARDS=32
MAX_OTHERS=16
CLUSTER=scripts/cluster.sh
CERTS=$PWD/.cluster/certs
TARGET=${CARGO_TARGET_DIR:-target}
case $TARGET in /*) ;; *) TARGET=$PWD/$TARGET ;; esac
BIN=${SLOTRING_NODE_BIN:-$TARGET/release/node}

for value in "$NODES" "$ROUNDS" "$SHARD"; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "usage: $0 [NODES] [ROUNDS] [SHARD]" >&2; exit 2; }
done
((NODES >= 3 && ROUNDS >= 1)) || { echo "failover needs 3 nodes and 1 round" >&2; exit 2; }

"$CLUSTER" up "$NODES" >/dev/null
BASE=$(cat .cluster/base_port)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/slotring-failover.XXXXXX")

PROBES=()
stop_probes() {
    local pid
    for pid in "${PROBES[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PROBES[@]}"; do wait "$pid" 2>/dev/null || true; done
    PROBES=()
}
cleanup() {
    stop_probes
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Unix milliseconds, without forking.
now_ms() { local t=${EPOCHREALTIME//[!0-9]/}; echo $((t / 1000)); }
# ms_to_s MS: unix ms as unix seconds with three decimals.
ms_to_s() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# `shard-info S` as node I sees it, on one line, or nothing when it does not answer.
shard_info() {
    timeout 5 "$BIN" shard-info "$2" -a "127.0.0.1:$((BASE + $1))" -o json \
        --certs-dir "$CERTS" 2>/dev/null | tr -d ' \n' || true
}

# The leader id in a one-line shard-info.
leader_of() {
    local json=${1#*\"leader\"}
    sed -nE 's/^:\{[^}]*"id":"([^"]*)".*/\1/p' <<<"$json"
}

# The leader id node I names for SHARD, or nothing when it does not answer.
leader_seen_by() { leader_of "$(shard_info "$1" "$SHARD")"; }

# Prints "S I" for each shard S in 0..SCAN_SHARDS-1 and SHARD whose replica on node I says it
# leads S (nodes are asked in parallel; a node may also hold a stale or removed replica, whose
# answer names another leader or none, so only a node naming itself counts).
actual_leaders() {
    local index shard
    for ((index = 0; index < NODES; index++)); do
        for shard in $(seq 0 $((SCAN_SHARDS - 1))) "$SHARD"; do
            [[ $(leader_of "$(shard_info "$index" "$shard")") == "n$index" ]] &&
                echo "$shard $index"
        done >"$WORK/leads$index" &
    done
    wait
    cat "$WORK"/leads* | sort -n -u
}

# How many nodes other than DEAD name a leader other than DEAD for SHARD.
moved() {
    local dead=$1 index seen count=0
    for ((index = 0; index < NODES; index++)); do
        ((index == dead)) && continue
        seen=$(leader_seen_by "$index")
        [[ -n $seen && $seen != "n$dead" ]] && count=$((count + 1))
    done
    echo "$count"
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

# Whether the nodes placement wants for SHARD (its `target`, as node 0 sees it) all name the same
# leader.
settled() {
    local json node seen first=
    json=$(shard_info 0 "$SHARD")
    json=${json#*\"target\":[}
    json=${json%%]*}
    [[ -n $json ]] || return 1
    for node in ${json//[\",]/ }; do
        [[ $node =~ ^n([0-9]+)$ ]] || return 1
        seen=$(leader_seen_by "${BASH_REMATCH[1]}")
        [[ -n $seen && ${first:=$seen} == "$seen" ]] || return 1
    done
}

# Unix ms of the first "member down member=nV" line at or after unix ms SINCE in a survivor's
# log, or nothing.
swim_down() {
    local victim=$1 since=$2 index stamp ms first=
    for ((index = 0; index < NODES; index++)); do
        ((index == victim)) && continue
        while read -r stamp; do
            ms=$(date -d "$stamp" +%s%3N) || continue
            if ((ms >= since)); then
                if [[ -z $first ]] || ((ms < first)); then first=$ms; fi
                break
            fi
        done < <(grep -F "member down member=n$victim " ".cluster/n$index.log" | awk '{ print $1 }')
    done
    echo "$first"
}

# Starts a probe writing SHARD_ARGS... every INTERVAL ms through node SEED, output to FILE.
start_probe() {
    local file=$1 interval=$2 seed=$3
    shift 3
    "$BIN" probe "$@" --interval "$interval" --attempt-timeout 200 ${PROBE_VERBOSE:+--verbose} \
        -a "127.0.0.1:$((BASE + seed))" --certs-dir "$CERTS" -o json >"$file" 2>&1 &
    PROBES+=($!)
}

# Whether no write in the probe outputs FILE... failed in the last QUIET_MS: every outage ended,
# the last one at least QUIET_MS ago.
quiet() {
    cat "$@" | awk -v now="$(now_ms)" -v q="$QUIET_MS" '
        /"event":"(failing|changed|recovered)"/ && match($0, /"at_ms":[0-9]+/) {
            t = substr($0, RSTART + 8, RLENGTH - 8) + 0
            if (t > last) last = t
        }
        /"event":"failing"/ { failing++ }
        /"event":"recovered"/ { recovered++ }
        END { exit !(failing == recovered && now - last >= q) }'
}

# The probe's lines of EVENT for shard S in FILE.
events() { grep -F "\"event\":\"$2\"" "$1" | grep -F "\"shard\":$3," || true; }

# The unix ms of the first acknowledgement to SHARD in FILE after unix ms KILLED that ended an
# outage (or, IDLE=1, was the probe's first), and how many writes failed before it.
first_ack() {
    { events "$1" recovered "$SHARD"; events "$1" up "$SHARD"; } | awk -v k="$2" '
        match($0, /"at_ms":[0-9]+/) && substr($0, RSTART + 8, RLENGTH - 8) + 0 > k + 0 {
            at = substr($0, RSTART + 8, RLENGTH - 8)
            failed = match($0, /"failed":[0-9]+/) ? substr($0, RSTART + 9, RLENGTH - 9) : 0
            print at, failed
            exit
        }'
}

# Per shard in FILE (SHARD excluded unless ONLY is set): the ms its writes failed in outages
# that ended after unix ms KILLED (not counting ones that ended at or before unix ms AFTER),
# plus any outage still open when the probe stopped (until the stop). Prints "shard ms" lines
# for shards that failed at all.
blocked() {
    local file=$1 killed=$2 after=$3 only=${4:-}
    awk -v k="$killed" -v after="$after" -v only="$only" -v main="$SHARD" '
        function num(name,   v) {
            if (!match($0, "\"" name "\":[0-9]+")) return -1
            v = substr($0, RSTART, RLENGTH); sub(/.*:/, "", v); return v + 0
        }
        {
            shard = num("shard")
            if (only != "" ? (shard != only + 0) : (shard == main + 0)) next
        }
        /"event":"recovered"/ && num("at_ms") > k + 0 && num("at_ms") > after + 0 {
            ms[shard] += num("outage_ms")
        }
        /"event":"summary"/ && num("failing_since_ms") >= 0 {
            ms[shard] += num("at_ms") - num("failing_since_ms")
        }
        END { for (s in ms) if (ms[s] > 0) print s, ms[s] }' "$file"
}

# Restarts node VICTIM and waits until every node lists all members alive and SHARD's target
# replicas agree on its leader.
restart_victim() {
    local started
    "$CLUSTER" restart "$1" >/dev/null
    started=$(now_ms)
    until all_alive && settled; do
        (($(now_ms) - started < DEADLINE_SECONDS * 1000)) ||
            { echo "round $round: n$1 not back within ${DEADLINE_SECONDS}s" >&2; exit 1; }
        sleep 0.2
    done
}

DOWN=() ELECT=() WRITE=() AGAIN=() OTHER=() HIT=() DISK=()
retries=0
for ((round = 1; round <= ROUNDS; round++)); do
    # A restarted node takes its shards back by handoffs for a while after it is settled: the
    # moment between two leaders is not a failure, so look again for up to DEADLINE_SECONDS.
    looked=$(now_ms)
    while
        leaders=$(actual_leaders)
        victim=$(awk -v s="$SHARD" '$1 == s { print $2; exit }' <<<"$leaders")
        [[ -z $victim ]] && (($(now_ms) - looked < DEADLINE_SECONDS * 1000))
    do
        sleep 0.2
    done
    [[ -n $victim ]] || { echo "round $round: no node leads shard $SHARD" >&2; exit 1; }
    seed=0
    ((seed == victim)) && seed=1
    others=$(awk -v s="$SHARD" -v v="$victim" -v max="$MAX_OTHERS" '
        $1 != s && $2 != v && !seen[$1]++ && n < max { printf "%s%s", n++ ? "," : "", $1 }' <<<"$leaders")
    [[ -n $others ]] || { echo "round $round: no other shard led by a survivor" >&2; exit 1; }

    main=.cluster/probe-r$round-shard$SHARD.jsonl
    rest=.cluster/probe-r$round-others.jsonl
    : >"$main"
    [[ -n $IDLE ]] || start_probe "$main" 10 "$seed" --shard "$SHARD"
    args=(--shard "${others%%,*}")
    [[ $others == *,* ]] && args+=(--also-shard "${others#*,}")
    start_probe "$rest" 50 "$seed" "${args[@]}"
    want=$(($([[ -n $IDLE ]] && echo 0 || echo 1) + $(tr ',' '\n' <<<"$others" | wc -l)))
    started=$(now_ms)
    until (($(cat "$main" "$rest" | grep -c '"event":"up"' || true) == want)); do
        (($(now_ms) - started < DEADLINE_SECONDS * 1000)) ||
            { echo "round $round: the probes never wrote every key:" >&2; cat "$main" "$rest" >&2; exit 1; }
        sleep 0.05
    done
    started=$(now_ms)
    until (($(now_ms) - started >= QUIET_MS)) && quiet "$main" "$rest"; do
        (($(now_ms) - started < QUIET_SECONDS * 1000)) ||
            { echo "round $round: writes kept failing for ${QUIET_SECONDS}s before the kill" >&2; exit 1; }
        sleep 0.1
    done
    steady=$(($(now_ms) - started))

    # Leaders may have moved while probing (a node that joined or came back takes shards over
    # for a few seconds): look again just before the kill. If SHARD's leader moved, the round
    # starts over; other shards that the victim leads now are left out of its figures.
    leaders=$(actual_leaders)
    leader=$(awk -v s="$SHARD" '$1 == s { print $2; exit }' <<<"$leaders")
    if [[ $leader != "$victim" ]]; then
        stop_probes
        ((++retries <= 5)) || { echo "round $round: shard $SHARD's leader keeps moving" >&2; exit 1; }
        echo "round $round: shard $SHARD's leader moved from n$victim to n${leader:-?} while probing; again"
        ((round--)) || true
        continue
    fi
    excluded=$(awk -v v="$victim" -v list=",$others," '
        { led[$1] = $2 }
        END {
            n = split(substr(list, 2, length(list) - 2), s, ",")
            for (i = 1; i <= n; i++) if (!(s[i] in led) || led[s[i]] == v) printf "%s ", s[i]
        }' <<<"$leaders")

    killed=$(now_ms)
    "$CLUSTER" kill "$victim" >/dev/null
    signalled=$(($(now_ms) - killed))
    [[ -z $IDLE ]] || start_probe "$main" 10 "$seed" --shard "$SHARD"
    while :; do
        count=$(moved "$victim")
        swept=$(($(now_ms) - killed))
        ((count < NODES - 1)) || break
        ((swept < DEADLINE_SECONDS * 1000)) ||
            { echo "round $round: no failover within ${DEADLINE_SECONDS}s" >&2; exit 1; }
        sleep 0.02
    done
    elect=$swept

    no_outage=
    until [[ -n $(first_ack "$main" "$killed") ]]; do
        if [[ -z $IDLE ]] && (($(now_ms) - killed > WATCH_MS)) &&
            ! grep -q '"event":"failing"' "$main"; then
            no_outage=1
            break
        fi
        (($(now_ms) - killed < DEADLINE_SECONDS * 1000)) ||
            { echo "round $round: no write to shard $SHARD acknowledged within ${DEADLINE_SECONDS}s" >&2; exit 1; }
        sleep 0.05
    done
    while (($(now_ms) - killed < WATCH_MS)); do sleep 0.1; done
    stop_probes
    if [[ -n $no_outage ]]; then
        # SHARD's leader moved between the last look and the kill.
        ((++retries <= 5)) || { echo "round $round: shard $SHARD's leader keeps moving" >&2; exit 1; }
        echo "round $round: writes to shard $SHARD never failed (its leader moved off n$victim just before the kill); again"
        restart_victim "$victim"
        ((round--)) || true
        continue
    fi

    read -r acked failed < <(first_ack "$main" "$killed")
    write=$((acked - killed))
    again=$(blocked "$main" "$killed" "$acked" "$SHARD" | awk '{ print $2 }')
    again=${again:-0}
    read -r hit other < <(blocked "$rest" "$killed" 0 | awk -v skip=" $excluded" '
        index(skip, " " $1 " ") { next }
        { n++; if ($2 > max) max = $2 } END { print n + 0, max + 0 }')
    sampled=$(($(tr ',' '\n' <<<"$others" | wc -l) - $(wc -w <<<"$excluded")))
    down=$(swim_down "$victim" "$killed")
    [[ -z $down ]] || down=$((down - killed))
    survivor_logs=()
    for ((index = 0; index < NODES; index++)); do
        ((index == victim)) || survivor_logs+=(".cluster/n$index.log")
    done
    disk=$(slowest_commit "$(ms_to_s "$killed")" "$(ms_to_s $((killed + WATCH_MS)))" \
        "${survivor_logs[@]}")

    echo "round $round: after ${steady} ms of probing, killed n$victim (leader of shard $SHARD;" \
        "SIGKILL sent within ${signalled} ms)," \
        "probes via n$seed: first acknowledged write at ${write} ms ($failed writes failed);" \
        "SWIM down at ${down:-?} ms; every survivor names the new leader at ${elect} ms; shard" \
        "$SHARD blocked again for ${again} ms; $hit of $sampled other shards blocked, longest" \
        "${other} ms${excluded:+ (left out, now led by n$victim or no one: $excluded)};" \
        "survivors' slowest group commit: ${disk} ms (0: none over 100 ms)"
    DOWN+=("${down:-none}") ELECT+=("$elect") WRITE+=("$write") AGAIN+=("$again")
    OTHER+=("$other") HIT+=("$hit") DISK+=("$disk")
    retries=0

    restart_victim "$victim"
done

# NAME and min / median / max over numeric values (others counted apart).
summary() {
    local name=$1; shift
    printf '%s\n' "$@" | sort -n | awk -v name="$name" '
        /^[0-9]+$/ { v[++n] = $1; next } { t++ }
        END {
            if (!n) { printf "%s: no numeric rounds (%d others)\n", name, t; exit }
            med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
            printf "%s: min %d, median %g, max %d (n=%d%s)\n", name, v[1], med, v[n], n,
                t ? ", others " t : ""
        }'
}

echo "summary over $ROUNDS rounds, $NODES nodes, shard $SHARD (ms from the kill${IDLE:+; the shard idle}):"
name=slotring${IDLE:+ idle}
summary "$name write_ms (first acknowledged write to the shard)" "${WRITE[@]}"
summary "$name down_ms (first survivor's SWIM declares the victim down)" "${DOWN[@]}"
summary "$name elect_ms (every survivor names the new leader)" "${ELECT[@]}"
summary "$name again_ms (the shard blocked again after its first write)" "${AGAIN[@]}"
summary "$name other_ms (longest block of a sampled shard led by a survivor)" "${OTHER[@]}"
summary "$name other_hit (sampled shards led by survivors that were blocked at all)" "${HIT[@]}"
summary "$name disk_ms (survivors' slowest group commit logged over 100 ms; 0: none)" "${DISK[@]}"
