#!/usr/bin/env bash
# Membership benchmark on 5 local nodes (127.0.0.1 only, default configuration), each phase on
# a fresh cluster:
#   idle      - M minutes idle: false downs and any non-alive state seen by polling `members` on
#               every node every 10 s.
#   pause     - M minutes of n2 being SIGSTOPped 300 ms then SIGCONTed for 700 ms: false downs
#               and pauses done.
#   False downs are counted two ways: "member down" lines (a peer declared a member down) and
#   "the cluster declared this node down; rejoining" lines (a node was told it is down and
#   renewed its generation); the target (0) applies to their sum.
#   join      - 10 rounds: start a 6th node n5 joining n0 and time, from its process start, until
#               all 5 others list it alive; then SIGTERM it and wait until all list it left.
#               n5 keeps its data dir, so each restart bumps its generation.
#   footprint - after 60 s idle, VmRSS and CPU% (utime+stime over a 60 s window) per node.
# Prints a summary with PASS/FAIL against the targets at the end. Work dir (logs, data) is kept
# under /tmp and named in the output. It signals only the PIDs it started (nodes and its own
# polling subshells), and on exit stops whichever of them are still running.
#
# usage: scripts/bench/membership.sh [--minutes M] [--only idle|pause|join|footprint]
#   M defaults to 10. SLOTRING_BENCH_PORT: base port (default 7600; uses BASE..BASE+5).
#   SLOTRING_NODE_BIN: use that binary instead of building one (it is copied either way).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
    echo "usage: $0 [--minutes M] [--only idle|pause|join|footprint]" >&2
    exit 2
}

MINUTES=10
ONLY=all
while (($#)); do
    case $1 in
        --minutes) (($# >= 2)) || usage; MINUTES=$2; shift 2 ;;
        --only) (($# >= 2)) || usage; ONLY=$2; shift 2 ;;
        -h | --help) usage ;;
        *) usage ;;
    esac
done
[[ $MINUTES =~ ^[0-9]+$ ]] && ((MINUTES >= 1)) || usage
case $ONLY in all | idle | pause | join | footprint) ;; *) usage ;; esac

BASE=${SLOTRING_BENCH_PORT:-7600}
[[ $BASE =~ ^[0-9]+$ ]] || { echo "SLOTRING_BENCH_PORT must be a number" >&2; exit 2; }
NODES=5
JOIN_ROUNDS=10
POLL_SECONDS=10
READY_SECONDS=60
CLK_TCK=$(getconf CLK_TCK)

# --- bookkeeping of what we started -------------------------------------------------------------
# LIVE holds every PID we started and have not reaped yet (an unreaped child's PID cannot be
# reused, so signalling these is always safe).
declare -A LIVE=()
declare -A NODE_PID=()
SUMMARY=()

alive_pid() { # running (not a zombie) and ours
    local pid=$1 stat
    [[ -n ${LIVE[$pid]:-} ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

reap() {
    local pid=$1
    wait "$pid" 2>/dev/null || true
    unset "LIVE[$pid]"
}

# Stop the given PIDs (ours only): SIGCONT (a stopped one cannot act on SIGTERM), SIGTERM, then
# SIGKILL after GRACE seconds; reap them.
stop_pids() {
    local grace=$1 pid deadline
    shift
    for pid in "$@"; do
        if alive_pid "$pid"; then
            kill -CONT "$pid" 2>/dev/null || true
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
    deadline=$((SECONDS + grace))
    for pid in "$@"; do
        while alive_pid "$pid" && ((SECONDS < deadline)); do sleep 0.05; done
        if alive_pid "$pid"; then
            echo "  pid $pid did not exit after SIGTERM; SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        if [[ -n ${LIVE[$pid]:-} ]]; then reap "$pid"; fi
    done
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if ((${#LIVE[@]})); then
        stop_pids 5 "${!LIVE[@]}"
    fi
    [[ -n ${WORK:-} ]] && echo "work dir (logs): $WORK" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
stamp() { date +%T; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
say() { echo "[$(stamp)] $*"; }
# Host stall time (PSI totals, microseconds) since psi_mark: other work on this machine shows
# up here, and a phase with seconds of it measured the machine rather than the node.
psi_total() { # cpu|memory some|full
    local v
    v=$(sed -nE "s/^$2 .*total=([0-9]+).*/\1/p" "/proc/pressure/$1" 2>/dev/null) || true
    echo "${v:-0}"
}
psi_mark() { PSI_CPU=$(psi_total cpu some) PSI_MEM=$(psi_total memory full); }
psi_since() {
    awk -v c=$(($(psi_total cpu some) - PSI_CPU)) -v m=$(($(psi_total memory full) - PSI_MEM)) \
        'BEGIN {printf "host stalls: cpu-some %.1f s, memory-full %.1f s", c / 1e6, m / 1e6}'
}

# --- binary and certificates --------------------------------------------------------------------
WORK=$(mktemp -d /tmp/slotring-membership.XXXXXX)
if [[ -n ${SLOTRING_NODE_BIN:-} ]]; then
    SRC_BIN=$SLOTRING_NODE_BIN
else
    TARGET=${CARGO_TARGET_DIR:-target}
    case $TARGET in /*) ;; *) TARGET=$PWD/$TARGET ;; esac
    SRC_BIN=$TARGET/release/node
    for attempt in 1 2 3 4 5; do
        if cargo build --release -p node >"$WORK/build.log" 2>&1; then break; fi
        ((attempt < 5)) || { tail -20 "$WORK/build.log" >&2; echo "build failed" >&2; exit 1; }
        echo "build failed (attempt $attempt); retrying in 60 s" >&2
        sleep 60
    done
fi
# A private copy: others may rebuild target/ while this runs.
BIN=$WORK/node
cp "$SRC_BIN" "$BIN"
CERTS=$WORK/certs
"$BIN" certs init --certs-dir "$CERTS" >/dev/null
for ((i = 0; i <= NODES; i++)); do "$BIN" certs issue "n$i" --certs-dir "$CERTS" >/dev/null; done

for ((port = BASE; port <= BASE + NODES; port++)); do
    if ss -Hlun "sport = :$port" | grep -q .; then
        echo "UDP port $port is in use; set SLOTRING_BENCH_PORT" >&2
        exit 1
    fi
done

echo "== slotring membership benchmark $(date -Is)"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)" \
    "($(git status --porcelain 2>/dev/null | wc -l) uncommitted paths)," \
    "binary sha256 $(sha256sum "$BIN" | cut -c1-16)"
echo "machine: $(nproc) cores, $(lscpu | sed -nE 's/^Model name:[[:space:]]*//p'), load $(loadavg)"
echo "minutes $MINUTES, only $ONLY, ports $BASE..$((BASE + NODES)), work dir $WORK"

# --- cluster helpers ------------------------------------------------------------------------------
CL= # current cluster dir

addr() { echo "127.0.0.1:$((BASE + $1))"; }

start_node() { # I [join]
    local i=$1 join=${2:-}
    local args=(--listen "$(addr "$i")" --node-id "n$i" --data-dir "$CL/n$i" --certs-dir "$CERTS")
    [[ -n $join ]] && args+=(--join "$(addr 0)")
    RUST_LOG=info "$BIN" "${args[@]}" >/dev/null 2>>"$CL/n$i.log" &
    NODE_PID[$i]=$!
    LIVE[$!]=1
}

members_json() { # I
    "$BIN" members -a "$(addr "$1")" --certs-dir "$CERTS" -o json --timeout 2 2>/dev/null
}

# Whether every one of nodes 0..N-1 lists exactly N members, all alive.
all_alive() {
    local n=$1 i json count
    for ((i = 0; i < n; i++)); do
        json=$(members_json "$i") || return 1
        count=$(jq '[.members[] | select(.state == "alive")] | length' <<<"$json") || return 1
        ((count == n)) || return 1
        (($(jq '.members | length' <<<"$json") == n)) || return 1
    done
}

cluster_up() { # NAME
    CL=$WORK/$1
    mkdir -p "$CL"
    local i deadline
    start_node 0
    deadline=$((SECONDS + READY_SECONDS))
    until members_json 0 >/dev/null; do
        ((SECONDS < deadline)) || { echo "n0 did not come up" >&2; exit 1; }
        sleep 0.1
    done
    for ((i = 1; i < NODES; i++)); do start_node "$i" join; done
    until all_alive "$NODES"; do
        ((SECONDS < deadline)) || { echo "cluster did not converge in ${READY_SECONDS}s" >&2; exit 1; }
        sleep 0.2
    done
    say "cluster $1 up: $NODES nodes alive everywhere (load $(loadavg))"
}

cluster_down() {
    local pids=() i
    for i in "${!NODE_PID[@]}"; do pids+=("${NODE_PID[$i]}"); done
    if ((${#pids[@]})); then stop_pids 10 "${pids[@]}"; fi
    NODE_PID=()
}

# Line counts of each log now, so later counts cover only what came after.
declare -A MARK=()
mark_logs() {
    local f
    MARK=()
    for f in "$CL"/n*.log; do MARK[$f]=$(wc -l <"$f"); done
}
since_mark() { # LOG
    tail -n +$((${MARK[$1]:-0} + 1)) "$1"
}
count_since_mark() { # PATTERN -> total over all logs
    local f total=0 c
    for f in "$CL"/n*.log; do
        c=$(since_mark "$f" | grep -c -- "$1" || true)
        total=$((total + c))
    done
    echo "$total"
}
# "declarer -> member" counts of "member down" lines since the mark, and the first few lines.
report_downs() {
    local f name
    for f in "$CL"/n*.log; do
        name=$(basename "$f" .log)
        since_mark "$f" | { grep -- "member down" || true; } |
            sed -nE "s/.*member=([^ ]+).*/  $name declared \1 down/p"
    done | sort | uniq -c | sed 's/^/ /'
    for f in "$CL"/n*.log; do since_mark "$f" | grep -- "member down" || true; done | sort | head -10 |
        sed 's/^/    /'
}

pass_fail() { if eval "$1"; then echo PASS; else echo FAIL; fi; }

# --- phases ---------------------------------------------------------------------------------------
phase_idle() {
    say "idle: $MINUTES min, polling members on all nodes every ${POLL_SECONDS}s"
    cluster_up idle
    mark_logs
    psi_mark
    local end=$((SECONDS + MINUTES * 60)) polls=0 nonalive=0 failed=0 i json out t0=$SECONDS
    while ((SECONDS < end)); do
        for ((i = 0; i < NODES; i++)); do
            polls=$((polls + 1))
            if ! json=$(members_json "$i"); then
                failed=$((failed + 1))
                echo "  +$((SECONDS - t0))s n$i: members query failed"
                continue
            fi
            out=$(jq -r '.members[] | select(.state != "alive") | "\(.id) \(.state) gen \(.generation)"' <<<"$json")
            if [[ -n $out ]]; then
                nonalive=$((nonalive + $(wc -l <<<"$out")))
                while read -r line; do echo "  +$((SECONDS - t0))s n$i sees $line"; done <<<"$out"
            fi
        done
        sleep "$POLL_SECONDS"
    done
    local downs renewed
    downs=$(count_since_mark "member down")
    renewed=$(count_since_mark "rejoining with a new generation")
    say "idle done: $downs member-down lines, $renewed renewals, $nonalive non-alive states in $polls polls ($failed failed), load $(loadavg), $(psi_since)"
    ((downs == 0)) || report_downs
    cluster_down
    SUMMARY+=("idle ${MINUTES}m: member-down lines $downs, forced renewals $renewed, non-alive states seen $nonalive/$polls polls, failed polls $failed  target 0 false downs: $(pass_fail "((downs + renewed == 0))")")
}

phase_pause() {
    say "pause: $MINUTES min of n2 SIGSTOP 300 ms / SIGCONT 700 ms"
    cluster_up pause
    mark_logs
    psi_mark
    local pid=${NODE_PID[2]} end=$((SECONDS + MINUTES * 60)) pauses=0 t0 t1 a b stopped
    local max_stop=0 long=0
    t0=$(now_ms)
    while ((SECONDS < end)); do
        a=${EPOCHREALTIME/./}
        kill -STOP "$pid"
        sleep 0.3
        kill -CONT "$pid"
        b=${EPOCHREALTIME/./}
        stopped=$(((b - a) / 1000))
        ((stopped > max_stop)) && max_stop=$stopped
        ((stopped > 400)) && long=$((long + 1))
        pauses=$((pauses + 1))
        sleep 0.7
    done
    t1=$(now_ms)
    sleep 3 # let the last pause settle before looking
    local downs renewed ups state_line
    downs=$(count_since_mark "member down")
    renewed=$(count_since_mark "rejoining with a new generation")
    ups=$(count_since_mark "member up")
    if all_alive "$NODES"; then state_line="all alive after"; else state_line="NOT all alive after"; fi
    say "pause done: $pauses pauses in $(((t1 - t0) / 1000)) s (longest stop $max_stop ms, $long over 400 ms), $downs member-down lines, $ups member-up lines, $renewed renewals of n2, $state_line; load $(loadavg), $(psi_since)"
    ((downs == 0)) || report_downs
    cluster_down
    SUMMARY+=("pause ${MINUTES}m: $pauses pauses of n2 (longest $max_stop ms, $long > 400 ms), member-down lines $downs, forced renewals of n2 $renewed (member-up lines $ups), $state_line  target 0 false downs: $(pass_fail "((downs + renewed == 0))")")
}

# Poll node I until it lists n5 alive with a generation above MINGEN; write ms since T0.
poll_seen() { # I MINGEN T0 OUT
    local i=$1 mingen=$2 t0=$3 out=$4 json deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
        if json=$(members_json "$i") &&
            jq -e --argjson g "$mingen" \
                'any(.members[]; .id == "n5" and .state == "alive" and .generation > $g)' \
                <<<"$json" >/dev/null; then
            echo $(($(now_ms) - t0)) >"$out"
            return 0
        fi
    done
    echo timeout >"$out"
}

# The generation of n5 if all of nodes 0..4 list it left (its newest entry), else nothing.
all_see_left() {
    local i json gen g=
    for ((i = 0; i < NODES; i++)); do
        json=$(members_json "$i") || return 0
        gen=$(jq -r '[.members[] | select(.id == "n5")] | max_by(.generation) |
            select(.state == "left") | .generation' <<<"$json") || return 0
        [[ -n $gen && $gen != null ]] || return 0
        g=$gen
    done
    echo "$g"
}

phase_join() {
    say "join: $JOIN_ROUNDS rounds of n5 joining n0 (data dir kept: generation bumps each restart)"
    cluster_up join
    mark_logs
    local i t0 t call_ms=0 k
    t0=$(now_ms)
    for ((k = 0; k < 20; k++)); do members_json $((k % NODES)) >/dev/null; done
    call_ms=$((($(now_ms) - t0) / 20))
    say "one 'members -o json' call takes ~${call_ms} ms (the resolution of the timing below)"
    local round gen=0 times=() per leave_ms pids worst
    for ((round = 1; round <= JOIN_ROUNDS; round++)); do
        rm -f "$CL"/seen.*
        t0=$(now_ms)
        start_node 5 join
        pids=()
        for ((i = 0; i < NODES; i++)); do
            poll_seen "$i" "$gen" "$t0" "$CL/seen.$i" &
            LIVE[$!]=1
            pids+=("$!")
        done
        for pid in "${pids[@]}"; do reap "$pid"; done
        per=() worst=0
        for ((i = 0; i < NODES; i++)); do
            t=$(cat "$CL/seen.$i")
            per+=("n$i:$t")
            if [[ $t == timeout ]]; then worst=timeout; elif [[ $worst != timeout ]] && ((t > worst)); then worst=$t; fi
        done
        [[ $worst == timeout ]] && { echo "round $round: n5 not seen alive everywhere in 30 s: ${per[*]}" >&2; exit 1; }
        times+=("$worst")
        # Leave: SIGTERM, then wait until all 5 list it left.
        t0=$(now_ms)
        stop_pids 10 "${NODE_PID[5]}"
        unset "NODE_PID[5]"
        local deadline=$((SECONDS + 30)) g=
        until [[ -n $g ]]; do
            ((SECONDS < deadline)) || { echo "round $round: n5 not listed left everywhere in 30 s" >&2; exit 1; }
            g=$(all_see_left)
            [[ -n $g ]] || sleep 0.05
        done
        leave_ms=$(($(now_ms) - t0))
        say "round $round: n5 gen $g seen alive by all in $worst ms (${per[*]}); left everywhere in $leave_ms ms"
        gen=$g
    done
    local sorted median max
    sorted=$(printf '%s\n' "${times[@]}" | sort -n)
    median=$(awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print int((a[NR/2]+a[NR/2+1])/2)}' <<<"$sorted")
    max=$(tail -1 <<<"$sorted")
    local downs
    downs=$(count_since_mark "member down")
    say "join done: median $median ms, max $max ms; $downs member-down and $(count_since_mark "member left") member-left lines about n5's $JOIN_ROUNDS graceful leaves, load $(loadavg)"
    cluster_down
    SUMMARY+=("join x$JOIN_ROUNDS (n5, data dir kept): seen alive by all 5 median $median ms, max $max ms (poll ~${call_ms} ms)  target <= 1000 ms: $(pass_fail "((max <= 1000))")")
}

cpu_ticks() { # PID -> utime+stime
    local stat f
    stat=$(cat "/proc/$1/stat")
    stat=${stat##*) }
    read -r -a f <<<"$stat"
    # after "comm) ", field 3 (state) is f[0]; utime is field 14 -> f[11], stime f[12]
    echo $((f[11] + f[12]))
}
rss_kb() { sed -nE 's/^VmRSS:[[:space:]]*([0-9]+).*/\1/p' "/proc/$1/status"; }

phase_footprint() {
    say "footprint: 60 s idle, then CPU over 60 s and RSS"
    cluster_up footprint
    sleep 60
    psi_mark
    local i t0 t1 before=() after=() rss cpu max_rss=0 max_cpu=0 line=()
    t0=$(now_ms)
    for ((i = 0; i < NODES; i++)); do before[i]=$(cpu_ticks "${NODE_PID[$i]}"); done
    sleep 60
    t1=$(now_ms)
    for ((i = 0; i < NODES; i++)); do after[i]=$(cpu_ticks "${NODE_PID[$i]}"); done
    for ((i = 0; i < NODES; i++)); do
        rss=$(awk -v k="$(rss_kb "${NODE_PID[$i]}")" 'BEGIN {printf "%.1f", k / 1024}')
        cpu=$(awk -v d=$((after[i] - before[i])) -v hz="$CLK_TCK" -v ms=$((t1 - t0)) \
            'BEGIN {printf "%.2f", d / hz / (ms / 1000) * 100}')
        line+=("n$i ${rss}MB ${cpu}%")
        max_rss=$(awk -v a="$max_rss" -v b="$rss" 'BEGIN {print (b > a) ? b : a}')
        max_cpu=$(awk -v a="$max_cpu" -v b="$cpu" 'BEGIN {print (b > a) ? b : a}')
    done
    say "footprint: ${line[*]}; load $(loadavg), $(psi_since)"
    cluster_down
    SUMMARY+=("footprint (idle, 5 nodes): ${line[*]}")
    SUMMARY+=("  max RSS ${max_rss} MB  target <= 30 MB: $(pass_fail "awk 'BEGIN {exit !($max_rss <= 30)}'")")
    SUMMARY+=("  max CPU ${max_cpu}% of a core  target <= 1%: $(pass_fail "awk 'BEGIN {exit !($max_cpu <= 1)}'")")
}

for phase in idle pause join footprint; do
    if [[ $ONLY == all || $ONLY == "$phase" ]]; then "phase_$phase"; fi
done

echo
echo "== summary ($(date -Is), load $(loadavg))"
printf '%s\n' "${SUMMARY[@]}"
