#!/usr/bin/env bash
# Several servers, one memory: deploy/cluster.sh's cluster (Redis, 3 ecokv serve replicas with --store, HAProxy round
# robin) on loopback, driven by cluster.mjs (conversations moving between replicas, a replica killed, entries damaged
# in Redis, Redis stopped and started), Redis with a password; then every fault logged once a replica, and the cluster
# stopped cleanly.
#   tests/server/test-cluster.sh path/to/ecokv
set -euo pipefail
ECOKV=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=$(mktemp -d)
PIDS=()
trap 'rc=$?; [ $rc -eq 0 ] || for f in "$DIR"/*.log "$DIR"/cluster/*.log; do echo "--- $f"; tail -n 30 "$f"; done
      bash "$ROOT/deploy/cluster.sh" stop --dir "$DIR/cluster" >/dev/null 2>&1; kill "${PIDS[@]}" 2>/dev/null
      wait 2>/dev/null; rm -rf "$DIR"' EXIT
for tool in redis-server haproxy; do command -v $tool >/dev/null || { echo "missing $tool: run scripts/setup.sh"; exit 1; }; done

# Five free ports in a row: HAProxy's, Redis's, and the 3 replicas'.
read -r PORT REDIS FIRST < <(/usr/bin/python3 - <<'PY'
import socket
def free(n):
    for base in range(21000, 60000, 7):
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
            return base
        except OSError:
            pass
        finally:
            for s in socks: s.close()
base = free(5)
print(base, base + 1, base + 2)
PY
)
# Redis with a password (AUTH), which the replicas and redis-cli (REDISCLI_AUTH) send.
head -c 18 /dev/urandom | base64 > "$DIR/redis-password"
export REDISCLI_AUTH; REDISCLI_AUTH=$(cat "$DIR/redis-password")
# shellcheck disable=SC2086  # SERVE_ARGS: engine flags for every server (scripts/test-gpu.sh: -ngl 99)
bash "$ROOT/deploy/cluster.sh" start --dir "$DIR/cluster" --port "$PORT" --redis-port "$REDIS" --replica-port "$FIRST" \
    --redis-password-file "$DIR/redis-password" --ecokv "$ECOKV" -- --slots 2 --max-tokens 12 ${SERVE_ARGS:-}

start() {  # start NAME ARGS...: a server outside the cluster on a free port, its URL in $URL
    local name=$1; shift
    # shellcheck disable=SC2086
    "$ECOKV" serve --port 0 --port-file "$DIR/$name.port" --slots 2 --max-tokens 12 ${SERVE_ARGS:-} "$@" 2> "$DIR/$name.log" &
    PIDS+=($!)
    for _ in $(seq 300); do [[ -s "$DIR/$name.port" ]] && break; sleep 0.1; done
    [[ -s "$DIR/$name.port" ]] || { echo "server $name did not start"; exit 1; }
    URL=http://127.0.0.1:$(cat "$DIR/$name.port")
}
start ref; REF=$URL                     # one server: the answers the cluster must give
start fresh --cache-mib 0; FRESH=$URL   # keeping nothing: a full prefill's answers
start foreign --model "$ROOT/models/stories260K.gguf" --store "redis://127.0.0.1:$REDIS" \
    --store-password-file "$DIR/redis-password"; FOREIGN=$URL

/usr/bin/python3 "$ROOT/tests/support/page-variants.py" "$ROOT/models/tiny-vlm-sample.png" 18 "$DIR"
node "$ROOT/tests/server/cluster.mjs" "http://127.0.0.1:$PORT" "$REF" "$FRESH" "$FOREIGN" "$REDIS" "$DIR/cluster" "$DIR" "$ROOT"

for f in "$DIR"/cluster/r*.log; do  # a bad entry is asked for by every request continuing it: logged once a kind
    for fault in corrupted foreign; do
        n=$(grep -c "refused a $fault entry" "$f" || true)
        ((n <= 1)) || { echo "not ok - $(basename "$f") logged $n refused $fault entries"; exit 1; }
    done
done
grep -q "unreachable" "$DIR"/cluster/r*.log || { echo "not ok - no replica warned that Redis was down"; exit 1; }
pids=$(cat "$DIR"/cluster/*.pid)
bash "$ROOT/deploy/cluster.sh" stop --dir "$DIR/cluster"
for pid in $pids; do  # gone, or a zombie nobody reaps here (its parent, cluster.sh start, has exited)
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    stat=${stat##*) }
    [[ "${stat%% *}" == Z ]] || { echo "not ok - process $pid left running after stop"; exit 1; }
done
echo "ok - cluster"
