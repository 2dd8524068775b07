#!/bin/bash
# Redis memory of the sharded channels that nodes subscribe to: N users'
# channels (`presence-events:{<user>}`, default 10,000, users s<i> as
# presence-bench storm's), subscribed by 1 connection, then 2, ... up to K
# (default 6), as K nodes each watching every one of those users would. Each
# connection stands for one node: a node subscribes to a user's channel once,
# however many of its sessions watch the user. Runs on an empty redis-server
# in cluster mode (one node holding every slot) started with this
# repository's redis.conf, without the server or the bench. Prints, after
# each connection, the allocator's total (MEMORY STATS total.allocated)
# delta per channel: the channel itself with the first, and what each further
# subscriber adds (an entry in the channel's list of clients, and one in the
# connection's own table of its channels, whose key is a copy of the name).
#
# Usage: bench/scripts/redis-subscriptions.sh [N] [K] [PORT] [FORMAT]
#   FORMAT is the user id as a printf format of i, e.g.
#   '0c6f1f4e-5a44-4b8e-9d2e-%012d' for ids as long as a UUID.
#   (needs redis-server, redis-cli, python3)
set -euo pipefail
n=${1:-10000}
k=${2:-6}
port=${3:-7396}
format=${4:-s%d}
conf="$(cd "$(dirname "$0")/../.." && pwd)/redis.conf"
if redis-cli -p "$port" ping >/dev/null 2>&1; then
  echo "a Redis already answers on port $port; pass a free port" >&2
  exit 1
fi
dir=$(mktemp -d)
# Stops only the server this script started.
trap 'kill -9 "$(cat "$dir/redis.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$dir"' EXIT

redis-server "$conf" --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$dir" \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --appendonly no \
  --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" >/dev/null
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$port" cluster addslotsrange 0 16383 >/dev/null
for _ in $(seq 50); do
  redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok' && break
  sleep 0.1
done

python3 - "$n" "$k" "$port" "$format" <<'PY'
import socket, subprocess, sys
n, k, port, fmt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
channels = ["presence-events:{%s}" % (fmt % i) for i in range(n)]

def allocated():
    out = subprocess.check_output(["redis-cli", "-p", str(port), "memory", "stats"]).decode()
    lines = out.split("\n")
    return int(dict(zip(lines[0::2], lines[1::2]))["total.allocated"])

def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out

base = allocated()
conns, last = [], base
print("channel %r, %d channels" % (channels[0], n))
for j in range(1, k + 1):
    s = socket.create_connection(("127.0.0.1", port))
    conns.append(s)
    s.sendall(b"".join(resp("SSUBSCRIBE", c) for c in channels))
    seen, tail = 0, b""
    while seen < n:  # one confirmation per channel
        data = tail + s.recv(1 << 20)
        seen += data.count(b"ssubscribe")
        tail = data[-16:]
        seen -= tail.count(b"ssubscribe")
    total = allocated()
    print("%d subscribing connection(s): %.0f B per channel (this one added %.0f B)"
          % (j, (total - base) / n, (total - last) / n))
    last = total
PY
