#!/usr/bin/env bash
# Reference benchmark: Redis Cluster failover times, to compare slotring against.
#
# Each round starts a fresh 6-node Redis Cluster (3 primaries + 3 replicas, 127.0.0.1 only,
# cluster-node-timeout 1000, no persistence, each node in its own temp dir), waits until all
# nodes report cluster_state:ok, agree on the topology and every replica's link is up, then
# SIGKILLs the primary owning the slot of key "foo" and measures, from the kill (t0):
#   flag_ms          until every surviving node's CLUSTER NODES flags it "fail" (not "fail?")
#   write_ms         until `redis-cli -c SET foo x` against a surviving primary returns OK
#   other_blocked_ms for how long SETs to a key owned by ANOTHER (healthy) primary, looped in
#                    the background against that primary, were failing (Redis rejects every
#                    slot with CLUSTERDOWN while its cluster_state is fail); 0 if never
# Each attempt spawns one redis-cli, so figures have a few ms of resolution; the loops share
# the 2 cores with the servers. Prints each round, then min / median / max of each figure.
# Installs redis (apt-get) if redis-server / redis-cli are missing. Starts no system service;
# signals only the PIDs it started (recorded in PIDS) and kills those on exit.
#
# usage: scripts/bench/redis_failover.sh [ROUNDS=10]
#        REDIS_BENCH_PORT=7700 (base port; nodes use BASE..BASE+5, bus ports BASE+10000..)
set -euo pipefail

ROUNDS=${1:-10}
BASE=${REDIS_BENCH_PORT:-7700}
NODES=6
DEADLINE_MS=30000
KEY=foo

[[ $ROUNDS =~ ^[0-9]+$ ]] && ((ROUNDS >= 1)) || { echo "usage: $0 [ROUNDS=10]" >&2; exit 2; }
[[ $BASE =~ ^[0-9]+$ ]] && ((BASE >= 1024 && BASE + NODES + 10000 <= 65535)) ||
    { echo "REDIS_BENCH_PORT must be a port in 1024..$((65535 - 10000 - NODES))" >&2; exit 2; }

# --- redis installation (non-interactive; Debian 12 ships the redis-server binary in
# redis-tools, so that is tried first to avoid installing/starting the system service) ---
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "redis not found, installing with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=; ((EUID == 0)) || SUDO=sudo
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq redis-tools >/dev/null
    command -v redis-server >/dev/null || $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
fi

PIDS=()           # every process this script started and has not reaped yet
WORK=$(mktemp -d "${TMPDIR:-/tmp}/redis-failover.XXXXXX")

cleanup() {
    local pid
    {
        for pid in "${PIDS[@]}"; do kill -9 "$pid" || true; done
        for pid in "${PIDS[@]}"; do wait "$pid" || true; done
    } 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Drop PIDs from PIDS once they have been reaped (so a reused PID is never signalled).
forget() {
    local pid keep=() gone
    for pid in "${PIDS[@]}"; do
        for gone in "$@"; do [[ $pid == "$gone" ]] && continue 2; done
        keep+=("$pid")
    done
    PIDS=("${keep[@]}")
}

# Microseconds since the epoch, without forking (same clock as date +%s%N).
now_us() { local t=${EPOCHREALTIME//[!0-9]/}; echo "$t"; }
cli() { redis-cli -h 127.0.0.1 -p "$@"; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_until DESCRIPTION COMMAND...: poll COMMAND until it succeeds or DEADLINE_MS passes.
wait_until() {
    local what=$1 start; shift
    start=$(now_us)
    until "$@"; do
        if (($(now_us) - start > DEADLINE_MS * 1000)); then
            echo "timed out waiting for $what" >&2
            return 1
        fi
        sleep 0.02
    done
}

all_ping() {
    local i
    for ((i = 0; i < NODES; i++)); do [[ $(cli $((BASE + i)) ping 2>/dev/null) == PONG ]] || return 1; done
}

# CLUSTER NODES of one node, reduced to what every node must agree on:
# id, address, flags (without "myself"), primary id, link state, slots.
topology() {
    cli "$1" cluster nodes 2>/dev/null | awk '{
        f = $3; sub(/myself,/, "", f)
        printf "%s %s %s %s %s", $1, $2, f, $4, $8
        for (i = 9; i <= NF; i++) printf " %s", $i
        print ""
    }' | sort
}

# Healthy: cluster_state:ok everywhere, identical topology everywhere with 3 primaries owning
# slots and 3 replicas, all links connected, no fail flags, and every replica's link up.
healthy() {
    local i ref view
    for ((i = 0; i < NODES; i++)); do
        [[ $(cli $((BASE + i)) cluster info 2>/dev/null) == *cluster_state:ok* ]] || return 1
    done
    ref=$(topology "$BASE")
    [[ -n $ref ]] || return 1
    for ((i = 1; i < NODES; i++)); do
        view=$(topology $((BASE + i)))
        [[ $view == "$ref" ]] || return 1
    done
    awk -v n=$NODES '
        $3 ~ /fail|handshake|noaddr/ || $5 != "connected" { bad = 1 }
        $3 == "master" && NF > 5 { m++ }
        $3 == "slave" { s++ }
        END { exit !(!bad && NR == n && m == 3 && s == 3) }' <<<"$ref" || return 1
    for ((i = 0; i < NODES; i++)); do
        view=$(cli $((BASE + i)) info replication 2>/dev/null | tr -d '\r')
        [[ $view == *role:master* || $view == *master_link_status:up* ]] || return 1
    done
}

# Port of the primary owning SLOT, from node PORT's CLUSTER NODES.
owner_port() {
    cli "$1" cluster nodes | awk -v slot="$2" '$3 ~ /master/ {
        for (i = 9; i <= NF; i++) {
            if ($i ~ /^\[/) continue
            n = split($i, r, "-"); lo = r[1]; hi = (n == 2) ? r[2] : r[1]
            if (slot >= lo && slot <= hi) { split($2, a, "[:@]"); print a[2]; exit }
        }
    }'
}
node_id() { cli "$1" cluster myid; }

start_cluster() {
    local i port dir
    for ((i = 0; i < NODES; i++)); do
        port=$((BASE + i))
        if port_in_use "$port" || port_in_use $((port + 10000)); then
            echo "port $port or $((port + 10000)) on 127.0.0.1 is already in use" >&2
            return 1
        fi
        dir=$ROUND_DIR/$port
        mkdir -p "$dir"
        cat >"$dir/redis.conf" <<EOF
bind 127.0.0.1
port $port
dir $dir
daemonize no
logfile $dir/redis.log
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 1000
appendonly no
save ""
EOF
        redis-server "$dir/redis.conf" &
        PIDS+=($!)
        PORT_PID[$port]=$!
    done
    wait_until "redis-server to answer PING" all_ping
    local addrs=()
    for ((i = 0; i < NODES; i++)); do addrs+=("127.0.0.1:$((BASE + i))"); done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$ROUND_DIR/create.log" 2>&1 || { cat "$ROUND_DIR/create.log" >&2; return 1; }
    wait_until "a healthy cluster" healthy
}

stop_cluster() {
    local port pid pids=()
    for port in "${!PORT_PID[@]}"; do pids+=("${PORT_PID[$port]}"); done
    ((${#pids[@]})) || return 0
    {
        for pid in "${pids[@]}"; do kill -9 "$pid" || true; done
        for pid in "${pids[@]}"; do wait "$pid" || true; done
    } 2>/dev/null
    forget "${pids[@]}"
    PORT_PID=()
}

# Background loop: SET KEY via PORT until it succeeds (or the deadline); writes the time of
# the first success (µs) to FILE, or "timeout".
write_loop() {
    local port=$1 key=$2 file=$3 t0=$4 out
    while :; do
        out=$(cli "$port" -c set "$key" x 2>&1) || true
        if [[ $out == OK ]]; then now_us >"$file"; return; fi
        (($(now_us) - t0 > DEADLINE_MS * 1000)) && { echo timeout >"$file"; return; }
    done
}

# Background loop: SET KEY via PORT, logging "start_us end_us ok|fail" per attempt, until the
# stop file exists and the last attempt succeeded (or the deadline).
other_loop() {
    local port=$1 key=$2 log=$3 stop=$4 start=$5 out a b
    while :; do
        a=$(now_us)
        out=$(cli "$port" -c set "$key" x 2>&1) || true
        b=$(now_us)
        if [[ $out == OK ]]; then
            echo "$a $b ok" >>"$log"
            [[ -e $stop ]] && return
        else
            echo "$a $b fail" >>"$log"
        fi
        ((b - start > 2 * DEADLINE_MS * 1000)) && return
    done
}

# Is node PORT flagging node ID "fail" (a flag of its own, not "fail?")?
flags_fail() {
    cli "$1" cluster nodes 2>/dev/null | awk -v id="$2" '
        $1 == id { n = split($3, f, ","); for (i = 1; i <= n; i++) if (f[i] == "fail") ok = 1 }
        END { exit !ok }'
}

surviving_ok() {
    local port
    for port in "${SURVIVORS[@]}"; do
        [[ $(cli "$port" cluster info 2>/dev/null) == *cluster_state:ok* ]] || return 1
    done
}

ms() { echo $((($1 + 500) / 1000)); }

run_round() {
    local r=$1 slot dead dead_id other_key other third i port t0 log stop wfile
    ROUND_DIR=$WORK/round$r
    mkdir -p "$ROUND_DIR"
    declare -gA PORT_PID=()
    start_cluster

    slot=$(cli "$BASE" cluster keyslot "$KEY")
    dead=$(owner_port "$BASE" "$slot")
    dead_id=$(node_id "$dead")
    # A key owned by another primary, and a third primary to send SET foo to.
    for other_key in bar baz k{0..99}; do
        other=$(owner_port "$BASE" "$(cli "$BASE" cluster keyslot "$other_key")")
        [[ $other != "$dead" ]] && break
    done
    third=$(cli "$BASE" cluster nodes | awk -v a="$dead" -v b="$other" '$3 ~ /master/ {
        split($2, p, "[:@]"); if (p[2] != a && p[2] != b) { print p[2]; exit } }')
    SURVIVORS=()
    for ((i = 0; i < NODES; i++)); do
        port=$((BASE + i))
        [[ $port == "$dead" ]] || SURVIVORS+=("$port")
    done
    [[ $(cli "$third" -c set "$KEY" x) == OK && $(cli "$other" -c set "$other_key" x) == OK ]] ||
        { echo "round $r: writes fail before the kill" >&2; return 1; }

    log=$ROUND_DIR/other.log stop=$ROUND_DIR/stop wfile=$ROUND_DIR/write
    : >"$log"
    other_loop "$other" "$other_key" "$log" "$stop" "$(now_us)" &
    local other_pid=$!
    PIDS+=("$other_pid")
    wait_until "the background writer" test -s "$log"

    # The kill; reaping it at once keeps bash from printing "Killed" later on.
    {
        kill -9 "${PORT_PID[$dead]}"
        t0=$(now_us)
        wait "${PORT_PID[$dead]}" || true
    } 2>/dev/null
    forget "${PORT_PID[$dead]}"
    unset "PORT_PID[$dead]"
    write_loop "$third" "$KEY" "$wfile" "$t0" &
    local write_pid=$!
    PIDS+=("$write_pid")

    # (a) every survivor flags the dead node "fail"; each polled only until it does.
    local pending=("${SURVIVORS[@]}") still t_flag=timeout
    while ((${#pending[@]})); do
        still=()
        for port in "${pending[@]}"; do flags_fail "$port" "$dead_id" || still+=("$port"); done
        pending=("${still[@]}")
        if ((${#pending[@]} == 0)); then t_flag=$(($(now_us) - t0)); break; fi
        (($(now_us) - t0 > DEADLINE_MS * 1000)) && break
    done

    # (b) the write to foo.
    wait "$write_pid" || true
    forget "$write_pid"
    local t_write=timeout w
    w=$(cat "$wfile" 2>/dev/null || echo timeout)
    [[ $w == timeout ]] || t_write=$((w - t0))

    # (c) stop the background writer once every survivor is back to cluster_state:ok.
    wait_until "cluster_state:ok on the survivors" surviving_ok || true
    touch "$stop"
    wait "$other_pid" || true
    forget "$other_pid"
    # Blocked: from the start of the first failing attempt to the start of the first
    # successful attempt after the last failing one.
    local blocked blocked_from
    read -r blocked blocked_from < <(awk -v t0="$t0" '
        $3 == "fail" { if (!ff) ff = $1; lf = NR; fails++ }
        { s[NR] = $1; st[NR] = $3 }
        END {
            if (!fails) { print 0, "-"; exit }
            for (i = lf + 1; i <= NR; i++) if (st[i] == "ok") { print int((s[i] - ff) / 1000 + 0.5), int((ff - t0) / 1000 + 0.5); exit }
            print "timeout", int((ff - t0) / 1000 + 0.5)
        }' "$log")

    [[ $t_flag == timeout ]] || t_flag=$(ms "$t_flag")
    [[ $t_write == timeout ]] || t_write=$(ms "$t_write")
    echo "round $r: flag_ms=$t_flag write_ms=$t_write other_blocked_ms=$blocked (from +${blocked_from}ms)"
    FLAG+=("$t_flag") WRITE+=("$t_write") OTHER+=("$blocked")

    stop_cluster
    rm -rf "$ROUND_DIR"
}

# min / median / max over numeric values (timeouts counted separately).
summary() {
    local name=$1; shift
    printf '%s\n' "$@" | sort -n | awk -v name="$name" '
        /^[0-9]+$/ { v[++n] = $1; next } { t++ }
        END {
            if (!n) { printf "%-16s no successful rounds (%d timeouts)\n", name, t; exit }
            med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
            printf "%-16s min=%d median=%g max=%d  (n=%d%s)\n", name, v[1], med, v[n], n, t ? ", timeouts=" t : ""
        }'
}

FLAG=() WRITE=() OTHER=()
echo "redis failover benchmark: $(redis-server --version | awk '{print $3}'), $ROUNDS rounds," \
    "6 nodes (3 primaries + 3 replicas) on 127.0.0.1:$BASE-$((BASE + NODES - 1)), cluster-node-timeout 1000"
for ((r = 1; r <= ROUNDS; r++)); do run_round "$r"; done
echo "summary over $ROUNDS rounds (ms from kill -9):"
summary flag_ms "${FLAG[@]}"
summary write_ms "${WRITE[@]}"
summary other_blocked_ms "${OTHER[@]}"
