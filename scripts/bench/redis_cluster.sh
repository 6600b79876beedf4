# Redis Cluster helpers shared by the benchmark scripts that run Redis side by side with slotring
# (kv_vs_redis.sh, join_vs_redis.sh). Source it after setting REDIS_BASE (the first port);
# every redis-server it starts is remembered in REDIS_PIDS, and redis_down kills exactly those.
# Nothing here starts a system service.

REDIS_PIDS=()

# Installs redis-server, redis-cli and redis-benchmark with apt-get if any is missing.
redis_install() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null ||
        ! command -v redis-benchmark >/dev/null; then
        echo "redis not found, installing with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        local sudo=
        ((EUID == 0)) || sudo=sudo
        $sudo apt-get update -qq
        $sudo apt-get install -y -qq redis-tools >/dev/null
        command -v redis-server >/dev/null || $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
    fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
cli() { redis-cli -h 127.0.0.1 -p "$@"; }

# redis_start_node DIR PORT EXTRA_CONF: one cluster-enabled redis-server on 127.0.0.1:PORT with
# its files in DIR/PORT, in the background; waits until it answers PING.
redis_start_node() {
    local dir=$1 port=$2 extra=$3 deadline
    if port_in_use "$port" || port_in_use $((port + 10000)); then
        echo "port $port or $((port + 10000)) on 127.0.0.1 is in use" >&2
        return 1
    fi
    mkdir -p "$dir/$port"
    cat >"$dir/$port/redis.conf" <<CONF
bind 127.0.0.1
port $port
dir $dir/$port
daemonize no
logfile $dir/$port/redis.log
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 5000
save ""
$extra
CONF
    redis-server "$dir/$port/redis.conf" &
    REDIS_PIDS+=($!)
    deadline=$((SECONDS + 30))
    until [[ $(cli "$port" ping 2>/dev/null) == PONG ]]; do
        ((SECONDS < deadline)) || { echo "redis on $port did not answer PING" >&2; return 1; }
        sleep 0.05
    done
}

# redis_up DIR EXTRA_CONF: a fresh 3+3 cluster on REDIS_BASE .. REDIS_BASE+5; waits until every
# node says cluster_state:ok and every replica's link is up.
redis_up() {
    local dir=$1 extra=$2 i addrs=() deadline
    for ((i = 0; i < 6; i++)); do
        redis_start_node "$dir" $((REDIS_BASE + i)) "$extra" || return 1
        addrs+=("127.0.0.1:$((REDIS_BASE + i))")
    done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
        { cat "$dir/create.log" >&2; return 1; }
    deadline=$((SECONDS + 30))
    until redis_healthy; do
        ((SECONDS < deadline)) || { echo "redis cluster not healthy after 30 s" >&2; return 1; }
        sleep 0.1
    done
}

# Every node of the 3+3 cluster says cluster_state:ok, every primary has its replica, every
# replica's link is up.
redis_healthy() {
    local i view
    for ((i = 0; i < 6; i++)); do
        [[ $(cli $((REDIS_BASE + i)) cluster info 2>/dev/null) == *cluster_state:ok* ]] || return 1
        view=$(cli $((REDIS_BASE + i)) info replication 2>/dev/null | tr -d '\r')
        [[ $view == *role:master*connected_slaves:1* || $view == *master_link_status:up* ]] || return 1
    done
}

# Kills every redis-server started here, by PID, and waits for them.
redis_down() {
    local pid
    {
        for pid in "${REDIS_PIDS[@]}"; do kill -9 "$pid" || true; done
        for pid in "${REDIS_PIDS[@]}"; do wait "$pid" || true; done
    } 2>/dev/null
    REDIS_PIDS=()
}
