#!/bin/bash
# Redis memory per online user for three key layouts, written alone: N users
# (default 10,000; user c<i>, device d, as presence-bench's), each into an
# empty redis-server started with this repository's redis.conf, without the
# server or the bench. Prints the INFO used_memory delta per user.
#
#   s5       key schema 5: the lease (an integer value with a TTL), the
#            counter, the user's hash (d:<device>, seq) and the device's
#            deadline in 16 sorted-set buckets (skiplists at this size)
#   lp       the same with the deadlines in 128 buckets (listpacks)
#   lpnoseq  lp without the hash's seq field
#
# Usage: bench/scripts/redis-layouts.sh [N] [PORT]   (needs redis-server, redis-cli, python3)
set -euo pipefail
n=${1:-10000}
port=${2:-7395}
conf="$(cd "$(dirname "$0")/../.." && pwd)/redis.conf"

gen() {
  python3 - "$1" "$2" <<'PY'
import sys, time
variant, n = sys.argv[1], int(sys.argv[2])
out = sys.stdout.buffer
def cmd(*args):
    args = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
def fnv1a(s):
    h = 0x811C9DC5
    for c in s.encode():
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    return h
buckets = 16 if variant == "s5" else 128
now = int(time.time() * 1000)
run = 4321
for i in range(n):
    u = "c%d" % i
    stamp = (now - 1577836800000) << 9 | (i % 512)
    cmd("SET", "presence:{%s}:d" % u, stamp << 13 | run, "PX", 45000)
    cmd("SET", "presence-count:{%s}" % u, 1)
    if variant == "lpnoseq":
        cmd("HSET", "presence-status:{%s}" % u, "d:d", run)
    else:
        cmd("HSET", "presence-status:{%s}" % u, "d:d", run, "seq", now + i)
    cmd("ZADD", "presence-leases:{b%02d}" % (fnv1a(u) % buckets), now + 45000 + i, "%s:d" % u)
PY
}

used() { redis-cli -p "$port" info memory | tr -d '\r' | sed -n 's/^used_memory://p'; }

if redis-cli -p "$port" ping >/dev/null 2>&1; then
  echo "a Redis already answers on port $port; pass a free port" >&2
  exit 1
fi
dir=
# Stops only the server this script started.
trap '[ -n "$dir" ] && { kill -9 "$(cat "$dir/redis.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$dir"; }' EXIT

for variant in s5 lp lpnoseq; do
  dir=$(mktemp -d)
  redis-server "$conf" --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$dir" \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --appendonly no >/dev/null
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  before=$(used)
  gen "$variant" "$n" | redis-cli -p "$port" --pipe >/dev/null
  after=$(used)
  encoding=$(redis-cli -p "$port" object encoding "presence-leases:{b00}")
  echo "$variant: $(( (after - before) / n )) B per user (used_memory $before -> $after; deadline index: $encoding)"
  kill -9 "$(cat "$dir/redis.pid")" 2>/dev/null || true
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 || break; sleep 0.1; done
  rm -rf "$dir"
  dir=
done
