#!/usr/bin/env bash
# CI test of the image: builds it (deploy/image/build.sh), checks what is in
# it, and runs it against a real redis-server on this host:
#   1. `presence-server --help` runs in the image, as user 65534;
#   2. the image holds the binary, its libraries, the CA certificates and
#      redis.conf, and no other file;
#   3. a node in it answers /livez and /readyz with 200, and a WebSocket
#      client gets `hello`;
#   4. SIGTERM drains it: /readyz turns 503 while the client is still
#      connected (the drain delay), then the client sees close code 1001 and
#      the container exits 0 within the grace period.
#
#   deploy/image/test.sh                     # builds the release binary first
#   BINARY=target/release/presence-server deploy/image/test.sh
#
# Needs podman and runc (Debian: apt-get install -y podman runc),
# redis-server, curl, and node with clients/js's packages (npm ci there).
#
# What `podman run` needs on this machine class (Debian 12, podman 4.3,
# runc 1.1, a mixed cgroup v1/v2 setup, no CAP_SYS_RESOURCE), found by trying:
# - `--runtime runc`: crun refuses the cgroup setup (issue 40); runc works.
# - `--ulimit nofile=N:N --ulimit nproc=M:M`, both: podman's default limits
#   are above the hard ones, and runc, which cannot raise a limit without
#   CAP_SYS_RESOURCE, fails with "error setting rlimit type 7 (nofile) or
#   6 (nproc): operation not permitted". N at most
#   `ulimit -Hn` (20001 was refused where it is 20000); M at most 32768,
#   though `ulimit -Hu` said 96365 (the kernel's pid_max is 32768): 4096 here.
# - `--network host`: the node reaches the host's Redis on 127.0.0.1 and the
#   test reaches the node the same way, with no port mapping to go wrong.
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=${IMAGE:-localhost/presence-server:test}
NAME=presence-image-test
DRAIN_MS=3000
# SIGTERM to exit: the drain delay, then up to 5 s to close the sessions
# (and 5 more for queued webhooks, which this node has none of).
GRACE_S=15

tmp=$(mktemp -d "${TMPDIR:-/tmp}/presence-image-test.XXXXXX")
redis_pid=
client_pid=

fail() {
  echo "image test: FAILED: $*" >&2
  if podman container exists "$NAME" 2>/dev/null; then
    echo "--- the node's log (podman logs $NAME):" >&2
    podman logs "$NAME" 2>&1 | tail -n 40 >&2 || true
  fi
  if [ -s "$tmp/client.out" ]; then
    echo "--- the WebSocket client's output:" >&2
    cat "$tmp/client.out" >&2
  fi
  exit 1
}

step() {
  echo "image test: $*"
}

cleanup() {
  podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  [ -z "$client_pid" ] || kill "$client_pid" 2>/dev/null || true
  [ -z "$redis_pid" ] || kill "$redis_pid" 2>/dev/null || true
  [ -z "$redis_pid" ] || wait "$redis_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# Polls `$3...` every 0.05 s until it succeeds; fails with $1 after $2 seconds.
wait_for() {
  local what=$1 secs=$2
  shift 2
  local deadline=$(($(date +%s%3N) + secs * 1000))
  until "$@"; do
    [ "$(date +%s%3N)" -lt "$deadline" ] || fail "timed out after ${secs}s waiting for $what"
    sleep 0.05
  done
}

status_is() { # URL CODE: the URL answers CODE now
  [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$1")" = "$2" ]
}

client_said() { # LINE: the WebSocket client printed LINE
  grep -qx "$1" "$tmp/client.out" 2>/dev/null
}

free_port() {
  node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}

for tool in podman runc redis-server redis-cli curl node; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is not installed (see the top of $0)"
done
[ -d clients/js/node_modules/ws ] || fail "clients/js/node_modules/ws is missing: run npm ci in clients/js"

# Leftovers of an interrupted run.
podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true

step "building $IMAGE"
IMAGE=$IMAGE deploy/image/build.sh || fail "deploy/image/build.sh failed"

nofile=$(ulimit -Hn)
[ "$nofile" != unlimited ] || nofile=1048576
nproc=$(ulimit -Hu)
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ]; then nproc=4096; fi
run=(podman run --runtime runc --network host
  --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")

step "presence-server --help in the image"
"${run[@]}" --rm "$IMAGE" presence-server --help >"$tmp/help.out" 2>&1 ||
  fail "podman run $IMAGE presence-server --help failed: $(cat "$tmp/help.out")"
grep -q -- '--redis-url' "$tmp/help.out" || fail "--help does not list --redis-url: $(cat "$tmp/help.out")"
user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
[ "$user" = 65534:65534 ] || fail "the image runs as '$user', not 65534:65534"

step "what the image holds"
podman create --name "$NAME" "$IMAGE" >/dev/null || fail "podman create $IMAGE failed"
podman export "$NAME" | tar -t >"$tmp/files" || fail "podman export $NAME failed"
podman rm "$NAME" >/dev/null
for f in usr/local/bin/presence-server etc/ssl/certs/ca-certificates.crt etc/presence/redis.conf lib64/ld-linux-x86-64.so.2; do
  grep -qx "$f" "$tmp/files" || fail "the image has no /$f; it has: $(tr '\n' ' ' <"$tmp/files")"
done
extra=$(grep -v '/$' "$tmp/files" |
  grep -vxE 'usr/local/bin/presence-server|etc/ssl/certs/ca-certificates.crt|etc/presence/redis.conf|(usr/)?lib(64|/[a-z0-9_-]+)?/[^/]+\.so(\.[0-9]+)*' || true)
[ -z "$extra" ] || fail "the image holds files it should not: $extra"

step "a redis-server on this host"
redis_port=$(free_port)
redis-server redis.conf --port "$redis_port" --bind 127.0.0.1 --dir "$tmp" \
  --logfile "$tmp/redis.log" --daemonize no &
redis_pid=$!
wait_for "redis-server on port $redis_port to answer PING" 10 \
  redis-cli -p "$redis_port" ping >/dev/null 2>&1

step "a node in the image"
port=$(free_port)
internal=$(free_port)
# Dev auth: the node listens on loopback (--network host), where it is allowed.
"${run[@]}" -d --name "$NAME" \
  -e REDIS_URL="redis://localhost:$redis_port/0" \
  -e PRESENCE_DRAIN_DELAY_MS="$DRAIN_MS" \
  "$IMAGE" presence-server --listen "127.0.0.1:$port" --internal-listen "127.0.0.1:$internal" \
  >/dev/null || fail "podman run $IMAGE failed"
base=http://127.0.0.1:$internal
wait_for "$base/readyz to answer 200" 30 status_is "$base/readyz" 200
status_is "$base/livez" 200 || fail "$base/livez does not answer 200"

step "a WebSocket client gets hello"
node deploy/image/ws-client.js "ws://127.0.0.1:$port/ws?user=alice&device=ci" >"$tmp/client.out" 2>&1 &
client_pid=$!
wait_for "the WebSocket client's hello" 10 client_said hello

step "SIGTERM drains the node"
podman kill --signal TERM "$NAME" >/dev/null || fail "podman kill --signal TERM $NAME failed"
wait_for "/readyz to answer 503 on SIGTERM" 2 status_is "$base/readyz" 503
client_said "close 1001" && fail "the client was closed before the drain delay (${DRAIN_MS} ms) passed"
wait_for "the client to be closed with 1001" "$GRACE_S" client_said "close 1001"
code=$(timeout "$GRACE_S" podman wait "$NAME") ||
  fail "the container did not exit within ${GRACE_S}s of SIGTERM"
[ "$code" = 0 ] || fail "the container exited with $code, not 0"

step "passed"
