#!/usr/bin/env bash
# A local slotring cluster on 127.0.0.1 for trying things by hand. `up N` builds the node
# binary (release; SLOTRING_NODE_BIN names a prebuilt one instead), makes certificates once and
# starts nodes n0..n{N-1} on ports 7000+I (SLOTRING_BASE_PORT), n0 bootstrapping and the others
# joining it, and returns once every shard has an elected leader at its placement target
# (`node check`); the other commands stop, kill, pause, resume, restart and inspect them. Everything lives in ./.cluster of the
# repository (certs/, nI/ data dirs, nI.log, nI.pid); only PIDs recorded there, whose command
# line is still that node's, are ever signalled.
#
# usage: scripts/cluster.sh up N | down [--purge] | status | kill I | restart I | pause I
#                           | resume I | logs I [-n]
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=$PWD
DIR=$ROOT/.cluster
CERTS=$DIR/certs
TARGET=${CARGO_TARGET_DIR:-target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
# SLOTRING_NODE_BIN: use that binary instead of building one.
BIN=${SLOTRING_NODE_BIN:-$TARGET/release/node}
# A running cluster keeps the binary `up` started it with (recorded in .cluster/bin).
if [[ -z ${SLOTRING_NODE_BIN:-} && -f $DIR/bin ]]; then BIN=$(<"$DIR/bin"); fi
READY_SECONDS=30
STOP_SECONDS=5

usage() {
    echo "usage: scripts/cluster.sh up N | down [--purge] | status | demo | kill I | restart I" >&2
    echo "                          | pause I | resume I | logs I [-n]" >&2
    exit 2
}

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

# The base port: the one `up` recorded, else SLOTRING_BASE_PORT, else 7000.
base_port() {
    if [[ -f $DIR/base_port ]]; then
        cat "$DIR/base_port"
    else
        echo "${SLOTRING_BASE_PORT:-7000}"
    fi
}

# How many nodes `up` started.
size() { cat "$DIR/size"; }

require_cluster() {
    [[ -f $DIR/size ]] || die "no cluster in $DIR: run 'scripts/cluster.sh up N' first"
}

addr() { echo "127.0.0.1:$(($(base_port) + $1))"; }

check_index() {
    [[ $1 =~ ^[0-9]+$ ]] && (($1 < $(size))) || die "no node $1 (nodes are 0..$(($(size) - 1)))"
}

# The recorded PID of node I if that process is still node I of this cluster (its command line
# starts with our binary's name, directly or through an interpreter, and names this data dir),
# else nothing.
our_pid() {
    local index=$1 pid argv i
    [[ -f $DIR/n$index.pid ]] || return 0
    pid=$(<"$DIR/n$index.pid")
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 0
    mapfile -d '' argv <"/proc/$pid/cmdline" 2>/dev/null || return 0
    [[ ${#argv[@]} -gt 1 ]] || return 0
    # The binary `up` started (recorded), which may not be today's SLOTRING_NODE_BIN.
    local started=$BIN
    [[ -f $DIR/bin ]] && started=$(<"$DIR/bin")
    [[ ${argv[0]##*/} == "${started##*/}" || ${argv[1]##*/} == "${started##*/}" ]] || return 0
    for ((i = 1; i + 1 < ${#argv[@]}; i++)); do
        if [[ ${argv[i]} == --data-dir && ${argv[i + 1]} == "$DIR/n$index" ]]; then
            echo "$pid"
            return 0
        fi
    done
}

# alive, paused (stopped by SIGSTOP) or dead.
state_of() {
    local pid=$1 stat rest
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo dead; return; }
    rest=${stat##*) }
    case ${rest%% *} in
        T | t) echo paused ;;
        Z | X) echo dead ;;
        *) echo alive ;;
    esac
}

# Starts node I in the background, joining JOIN (an address) unless it is empty.
start_node() {
    local index=$1 join=$2 pid
    local args=(--listen "$(addr "$index")" --node-id "n$index" --data-dir "$DIR/n$index"
        --certs-dir "$CERTS")
    [[ -n $join ]] && args+=(--join "$join")
    [[ -x $BIN ]] || die "no $BIN: run 'scripts/cluster.sh up N' to build it"
    mkdir -p "$DIR/n$index"
    # Its own session, so a Ctrl-C in this terminal does not reach it; setsid does not fork
    # here (a background job is no group leader), so $! is the node's PID.
    env -u SLOTRING_JOIN setsid "$BIN" "${args[@]}" </dev/null >>"$DIR/n$index.log" 2>&1 &
    pid=$!
    echo "$pid" >"$DIR/n$index.pid"
    # Until it has exec'd, the child's command line is still this script's.
    local deadline=$((SECONDS + 5))
    while [[ -z $(our_pid "$index") ]]; do
        if [[ $(state_of "$pid") == dead ]] || ((SECONDS >= deadline)); then
            tail -n 20 "$DIR/n$index.log" >&2
            die "n$index did not start; its log is $DIR/n$index.log"
        fi
        sleep 0.05
    done
    echo "started n$index (pid $pid) on $(addr "$index")${join:+, joining $join}"
}

# `node members` of node I as JSON, or nothing if it does not answer within 5 s.
members_json() {
    timeout 5 "$BIN" members -a "$(addr "$1")" -o json --certs-dir "$CERTS" 2>/dev/null || true
}

# Polls until node I answers and lists WANT members, all alive (any number when WANT is
# empty); fails after READY_SECONDS.
wait_ready() {
    local index=$1 want=${2:-} deadline=$((SECONDS + READY_SECONDS)) json alive total
    while :; do
        [[ -n $(our_pid "$index") ]] || {
            tail -n 20 "$DIR/n$index.log" >&2
            die "n$index exited; its log is $DIR/n$index.log"
        }
        json=$(members_json "$index")
        # grep finds nothing while the node does not answer yet: not an error (pipefail).
        alive=$({ grep -oE '"state"[[:space:]]*:[[:space:]]*"alive"' <<<"$json" || true; } | wc -l)
        total=$({ grep -oE '"state"[[:space:]]*:' <<<"$json" || true; } | wc -l)
        [[ -z $want && -n $json ]] && return 0
        [[ -n $want ]] && ((alive == want && total == want)) && return 0
        ((SECONDS < deadline)) ||
            die "n$index lists $alive of $want members alive after ${READY_SECONDS}s: ${json:-no answer}"
        sleep 0.2
    done
}

# Polls `node check` until it passes: every shard has an elected leader whose voters are
# placement's target, every leadership has passed to placement's leader, and the replicas
# agree. A new cluster gets there within a second or two of its members converging; data
# moving to added nodes can take longer than READY_SECONDS, and then this only says so
# (`node rebalance --wait` follows the moves).
wait_settled() {
    local deadline=$((SECONDS + READY_SECONDS))
    until "$BIN" check -a "$(addr 0)" --certs-dir "$CERTS" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "shards still settling after ${READY_SECONDS}s: '$BIN rebalance --wait' follows them" >&2
            return 0
        fi
        sleep 0.2
    done
}

cmd_up() {
    local count=${1:-} index
    [[ $count =~ ^[1-9][0-9]*$ ]] || usage
    mkdir -p "$DIR"
    if [[ -f $DIR/size ]] && (($(size) > count)); then
        die "this cluster has $(size) nodes; 'down' first to start fewer"
    fi
    base_port >"$DIR/base.tmp" && mv "$DIR/base.tmp" "$DIR/base_port"
    echo "$count" >"$DIR/size"
    echo "$BIN" >"$DIR/bin"

    if [[ -z ${SLOTRING_NODE_BIN:-} ]]; then
        cargo build --release -p node
    fi
    if [[ ! -f $CERTS/ca.crt ]]; then
        "$BIN" certs init --certs-dir "$CERTS"
    fi
    for ((index = 0; index < count; index++)); do
        [[ -f $CERTS/n$index.crt ]] || "$BIN" certs issue "n$index" --certs-dir "$CERTS"
    done

    if [[ -z $(our_pid 0) ]]; then
        start_node 0 ""
    fi
    wait_ready 0
    for ((index = 1; index < count; index++)); do
        [[ -n $(our_pid "$index") ]] || start_node "$index" "$(addr 0)"
    done
    for ((index = 0; index < count; index++)); do
        wait_ready "$index" "$count"
    done
    wait_settled
    echo "all $count nodes list $count members alive. Query them with:"
    echo "  export SLOTRING_CERTS_DIR=$CERTS"
    echo "  ${BIN#"$ROOT"/} shard-info 42 -a $(addr 0)"
    echo "  ${BIN#"$ROOT"/} members | status | ring | check | shard-for KEY"
}

cmd_down() {
    local purge=${1:-} index pid deadline pids=()
    [[ -z $purge || $purge == --purge ]] || usage
    if [[ -f $DIR/size ]]; then
        for ((index = 0; index < $(size); index++)); do
            pid=$(our_pid "$index")
            if [[ -n $pid ]]; then
                kill -TERM "$pid" 2>/dev/null || true
                # A paused node only sees the SIGTERM once it runs again.
                kill -CONT "$pid" 2>/dev/null || true
                pids+=("$index:$pid")
            fi
        done
        deadline=$((SECONDS + STOP_SECONDS))
        for entry in "${pids[@]}"; do
            while [[ -n $(our_pid "${entry%%:*}") ]] && [[ $(state_of "${entry#*:}") != dead ]] &&
                ((SECONDS < deadline)); do
                sleep 0.1
            done
            pid=$(our_pid "${entry%%:*}")
            if [[ -n $pid && $(state_of "$pid") != dead ]]; then
                echo "n${entry%%:*} (pid $pid) still runs after ${STOP_SECONDS}s: SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
            else
                echo "stopped n${entry%%:*}"
            fi
        done
        for ((index = 0; index < $(size); index++)); do
            rm -f "$DIR/n$index.pid"
        done
        rm -f "$DIR/bin"
    fi
    if [[ $purge == --purge ]]; then
        rm -rf "$DIR"
        echo "removed $DIR"
    fi
}

cmd_status() {
    local index pid state first=""
    for ((index = 0; index < $(size); index++)); do
        pid=$(our_pid "$index")
        state=dead
        [[ -n $pid ]] && state=$(state_of "$pid")
        printf 'n%-3s %-16s pid %-8s %s\n' "$index" "$(addr "$index")" "${pid:--}" "$state"
        [[ -z $first && $state == alive ]] && first=$index
    done
    if [[ -n $first ]]; then
        echo
        echo "members as n$first sees them:"
        timeout 10 "$BIN" members -a "$(addr "$first")" --certs-dir "$CERTS" ||
            echo "(n$first did not answer)"
    fi
}

# Shows the cluster working: the status, then a write through the first live node, a read of it
# through the last one, and where the key's shard lives.
cmd_demo() {
    cmd_status
    local index pid live=()
    for ((index = 0; index < $(size); index++)); do
        pid=$(our_pid "$index")
        [[ -n $pid && $(state_of "$pid") == alive ]] && live+=("$index")
    done
    ((${#live[@]} > 0)) || die "no node is running"
    local first=${live[0]} last=${live[${#live[@]} - 1]} value
    value="hello from $(date +%H:%M:%S)"
    echo
    echo "put demo:greeting through n$first, get it through n$last:"
    timeout 20 "$BIN" put demo:greeting "$value" -a "$(addr "$first")" --certs-dir "$CERTS" ||
        die "the write failed"
    timeout 20 "$BIN" get demo:greeting -a "$(addr "$last")" --certs-dir "$CERTS" ||
        die "the read failed"
    echo
    local shard
    shard=$(timeout 10 "$BIN" shard-for demo:greeting -a "$(addr "$first")" --certs-dir "$CERTS" -o json |
        sed -n 's/.*"shard": *\([0-9]*\).*/\1/p')
    [[ -n $shard ]] && timeout 10 "$BIN" shard-info "$shard" -a "$(addr "$last")" --certs-dir "$CERTS"
    return 0
}

cmd_signal() {
    local signal=$1 index=$2 pid
    check_index "$index"
    pid=$(our_pid "$index")
    [[ -n $pid ]] || die "n$index is not running"
    kill "-$signal" "$pid"
    echo "sent SIG$signal to n$index (pid $pid)"
}

cmd_restart() {
    local index=$1 pid other join="" deadline
    check_index "$index"
    pid=$(our_pid "$index")
    if [[ -n $pid ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        kill -CONT "$pid" 2>/dev/null || true
        deadline=$((SECONDS + STOP_SECONDS))
        while [[ -n $(our_pid "$index") && $(state_of "$pid") != dead ]] && ((SECONDS < deadline)); do
            sleep 0.1
        done
        if [[ -n $(our_pid "$index") && $(state_of "$pid") != dead ]]; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    for ((other = 0; other < $(size); other++)); do
        pid=$(our_pid "$other")
        if ((other != index)) && [[ -n $pid && $(state_of "$pid") == alive ]]; then
            join=$(addr "$other")
            break
        fi
    done
    start_node "$index" "$join"
}

cmd_logs() {
    local index=$1 follow=${2:-}
    check_index "$index"
    case $follow in
        "") exec tail -n 50 -f "$DIR/n$index.log" ;;
        -n) exec tail -n 50 "$DIR/n$index.log" ;;
        *) usage ;;
    esac
}

case ${1:-} in
    status | kill | pause | resume | restart | logs) require_cluster ;;
esac
case ${1:-} in
    up) cmd_up "${2:-}" ;;
    down) cmd_down "${2:-}" ;;
    status) cmd_status ;;
    demo) cmd_demo ;;
    kill) cmd_signal KILL "${2:-}" ;;
    pause) cmd_signal STOP "${2:-}" ;;
    resume) cmd_signal CONT "${2:-}" ;;
    restart) cmd_restart "${2:-}" ;;
    logs) cmd_logs "${2:-}" "${3:-}" ;;
    *) usage ;;
esac
