#!/usr/bin/env bash
# Several ecokv serve replicas as one server: Redis (Debian's redis-server), N replicas that share their kept
# conversations through it (ecokv serve --store), and HAProxy (deploy/haproxy.cfg) sending requests round robin,
# with health checks and retries; no session affinity. All on loopback; state, pids and logs in --dir.
#   deploy/cluster.sh start [--replicas N] [--port P] [--replica-port Q] [--redis-port R] [--redis-mib M]
#                           [--redis-password-file F] [--no-store] [--dir D] [--ecokv PATH] [-- SERVE_ARGS...]
#   deploy/cluster.sh stop [--dir D]                  everything, cleanly (SIGTERM, then SIGKILL after 10 s)
#   deploy/cluster.sh stop-one NAME [--dir D]        NAME: redis, or r1..rN as HAProxy names them (X-Ecokv-Replica)
#   deploy/cluster.sh start-one NAME [--dir D]       starts it again as it was started
#   deploy/cluster.sh status [--dir D]
# Defaults: 3 replicas; HAProxy on 127.0.0.1:8080, replicas on the ports after it (8081...), Redis on 6390 (not
# 6379, where Debian's redis-server service listens once installed) with
# 512 MiB and maxmemory-policy allkeys-lru (the least recently used entries go first); --dir ./cluster;
# --ecokv build/bin/ecokv. SERVE_ARGS go to every replica (e.g. --slots 2 --cache-mib 64). With a password file,
# Redis requires its first line (AUTH; given on Redis's stdin, not its command line) and every replica sends it.
# --no-store: the replicas keep conversations to themselves (what bench/bench-cluster.sh compares against).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

cmd=${1:-}
[[ -n "$cmd" ]] && shift
replicas=3 port=8080 replica_port="" redis_port=6390 redis_mib=512 dir=cluster ecokv="$ROOT/build/bin/ecokv" name=""
password_file="" store=1
serve_args=()
while (($#)); do
    case "$1" in
        --replicas) replicas=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --replica-port) replica_port=$2; shift 2 ;;
        --redis-port) redis_port=$2; shift 2 ;;
        --redis-mib) redis_mib=$2; shift 2 ;;
        --redis-password-file) password_file=$(realpath "$2"); shift 2 ;;
        --no-store) store=0; shift ;;
        --dir) dir=$2; shift 2 ;;
        --ecokv) ecokv=$2; shift 2 ;;
        --) shift; serve_args=("$@"); break ;;
        -*) echo "cluster.sh: unknown option '$1'" >&2; exit 2 ;;
        *) name=$1; shift ;;
    esac
done
[[ -z "$replica_port" ]] && replica_port=$((port + 1))

die() { echo "cluster.sh: $*" >&2; exit 1; }
alive() {  # alive PIDFILE: running, not a zombie (a killed replica's parent, this script, may be gone)
    [[ -s "$1" ]] || return 1
    local stat; stat=$(cat "/proc/$(cat "$1")/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ "${stat%% *}" != Z ]]
}
wait_for() {  # wait_for WHAT COMMAND...: up to 30 s
    local what=$1; shift
    for _ in $(seq 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "$what did not start (logs in $dir)"
}

start_replica() {  # start_replica NAME PORT
    local log="$dir/$1.log"
    rm -f "$dir/$1.port"
    local shared=()
    ((store)) && shared=(--store "redis://127.0.0.1:$redis_port")
    [[ -n "$password_file" ]] && ((store)) && shared+=(--store-password-file "$password_file")
    "$ecokv" serve --port "$2" --port-file "$dir/$1.port" ${shared[@]+"${shared[@]}"} \
        ${serve_args[@]+"${serve_args[@]}"} >> "$log" 2>&1 < /dev/null &
    echo $! > "$dir/$1.pid"
    wait_for "replica $1" test -s "$dir/$1.port"
}

start_redis() {  # no persistence: the store is a cache, and a restarted Redis starts empty
    local config=""
    if [[ -n "$password_file" ]]; then
        config="requirepass $(head -n 1 "$password_file")"
        export REDISCLI_AUTH; REDISCLI_AUTH=$(head -n 1 "$password_file")
    fi
    printf '%s\n' "$config" | redis-server - --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no --maxmemory "${redis_mib}mb" \
        --maxmemory-policy allkeys-lru --dir "$dir" --logfile "$dir/redis.log" --daemonize no > /dev/null 2>&1 &
    echo $! > "$dir/redis.pid"
    wait_for "redis on port $redis_port" redis-cli -p "$redis_port" ping
    # the Redis that answers is this one, not another already on the port (Debian's service, another cluster)
    [[ "$(redis-cli -p "$redis_port" info server 2>/dev/null | sed -n 's/^process_id:\([0-9]*\).*/\1/p')" == \
       "$(cat "$dir/redis.pid")" ]] || die "redis did not start: port $redis_port in use? ($dir/redis.log)"
}

stop_pid() {  # stop_pid PIDFILE: SIGTERM, SIGKILL after 10 s
    alive "$1" || { rm -f "$1"; return 0; }
    local pid; pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do alive "$1" || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$1"
}

case "$cmd" in
start)
    for tool in redis-server redis-cli haproxy curl; do
        command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh"
    done
    [[ -x "$ecokv" ]] || die "$ecokv is not built: run scripts/setup.sh"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    alive "$dir/haproxy.pid" && die "a cluster already runs from $dir (deploy/cluster.sh stop --dir $dir)"
    # what start-one needs
    declare -p redis_port redis_mib password_file store ecokv serve_args replica_port replicas > "$dir/cluster.env"
    start_redis
    servers=""
    for ((i = 1; i <= replicas; ++i)); do
        start_replica "r$i" $((replica_port + i - 1))
        servers+="    server r$i 127.0.0.1:$((replica_port + i - 1))"$'\n'
    done
    { sed "s|\${ECOKV_BIND}|127.0.0.1:$port|" "$ROOT/deploy/haproxy.cfg"; printf '%s' "$servers"; } > "$dir/haproxy.cfg"
    haproxy -f "$dir/haproxy.cfg" -db > "$dir/haproxy.log" 2>&1 < /dev/null &
    echo $! > "$dir/haproxy.pid"
    wait_for "haproxy on port $port" curl -sf "http://127.0.0.1:$port/health"
    sleep 0.3  # a port in use ends HAProxy at once, while whatever holds the port answers /health
    alive "$dir/haproxy.pid" || die "haproxy did not start: port $port in use? ($dir/haproxy.log)"
    echo "cluster: http://127.0.0.1:$port -> $replicas replicas (ports $replica_port-$((replica_port + replicas - 1))), redis on $redis_port; logs in $dir"
    ;;
stop)
    [[ -d "$dir" ]] || exit 0
    stop_pid "$dir/haproxy.pid"
    for f in "$dir"/r*.pid; do [[ -e "$f" ]] && stop_pid "$f"; done
    stop_pid "$dir/redis.pid"
    echo "cluster in $dir stopped"
    ;;
stop-one | start-one)
    [[ "$name" =~ ^(redis|r[0-9]+)$ ]] || die "$cmd needs redis or a replica's name (r1, r2, ...)"
    dir=$(cd "$dir" && pwd)
    # shellcheck disable=SC1091
    source "$dir/cluster.env"
    stop_pid "$dir/$name.pid"
    if [[ "$cmd" == start-one && "$name" == redis ]]; then
        start_redis
    elif [[ "$cmd" == start-one ]]; then
        start_replica "$name" $((replica_port + ${name#r} - 1))
    fi
    ;;
status)
    for f in "$dir"/*.pid; do
        [[ -e "$f" ]] || continue
        n=$(basename "$f" .pid)
        if alive "$f"; then echo "$n: running (pid $(cat "$f"))"; else echo "$n: stopped"; fi
    done
    ;;
*)
    echo "usage: deploy/cluster.sh start|stop|stop-one NAME|start-one NAME|status [options] (see its first lines)" >&2
    exit 2
    ;;
esac
