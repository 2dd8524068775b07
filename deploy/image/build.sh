#!/usr/bin/env bash
# Builds the presence-server image from the repository's Containerfile.
#
#   deploy/image/build.sh                 # cargo build --release, then the image
#   IMAGE=presence-server:dev deploy/image/build.sh
#   BINARY=path/to/presence-server deploy/image/build.sh   # skip cargo
#
# No registry need be reachable: the image is FROM scratch, and this script
# stages its build context from this machine: the release binary, the shared
# libraries `ldd` finds for it and the dynamic loader (the binary runs with
# the glibc it was linked against), the CA certificates and redis.conf.
# It builds with podman, or with docker when no podman is installed and the
# docker daemon answers (ENGINE=docker or ENGINE=podman to choose), and
# fails when the image is larger than MAX_MB (40).
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=${IMAGE:-localhost/presence-server:latest}
MAX_MB=${MAX_MB:-40}
CA_FILE=${CA_FILE:-/etc/ssl/certs/ca-certificates.crt}

die() {
  echo "build.sh: $*" >&2
  exit 1
}

if [ -z "${ENGINE:-}" ]; then
  if command -v podman >/dev/null 2>&1; then
    ENGINE=podman
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    ENGINE=docker
  else
    die "neither podman nor a running docker found (Debian: apt-get install -y podman runc)"
  fi
fi

if [ -z "${BINARY:-}" ]; then
  echo "build.sh: cargo build --release --locked"
  cargo build --release --locked
  BINARY=target/release/presence-server
fi
[ -x "$BINARY" ] || die "no executable at $BINARY"
[ -r "$CA_FILE" ] || die "no CA certificates at $CA_FILE (Debian: apt-get install -y ca-certificates)"

ctx=$(mktemp -d "${TMPDIR:-/tmp}/presence-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs

# Puts the file at host path $1 (symlinks followed) at the same path in the image.
stage() {
  install -D -m 755 "$(readlink -f "$1")" "$root$1"
}

install -D -m 755 "$BINARY" "$root/usr/local/bin/presence-server"
# `ldd` prints `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, the
# loader as `/lib64/ld-linux-x86-64.so.2 (0x...)` and the vDSO without a path.
libs=$(ldd "$BINARY") || die "ldd $BINARY failed: is it a dynamically linked Linux binary?"
if grep -q 'not found' <<<"$libs"; then
  die "ldd cannot resolve every library of $BINARY:"$'\n'"$libs"
fi
n=0
for lib in $(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$libs"); do
  stage "$lib"
  n=$((n + 1))
done
[ "$n" -ge 2 ] || die "ldd named $n libraries for $BINARY; expected the loader and libc at least"
install -D -m 644 "$(readlink -f "$CA_FILE")" "$root/etc/ssl/certs/ca-certificates.crt"
install -D -m 644 redis.conf "$root/etc/presence/redis.conf"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
echo "build.sh: $ENGINE build -t $IMAGE ($(du -sh "$root" | cut -f1) staged: $(find "$root" -type f | wc -l) files)"
# A rebuild leaves the image it replaces nameless: remove it (unless a
# container still uses it). Podman keeps no intermediate images then either.
old=$("$ENGINE" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
layers=()
[ "$ENGINE" = podman ] && layers=(--layers=false)
"$ENGINE" build "${layers[@]}" -f Containerfile --build-arg "VERSION=$version" -t "$IMAGE" "$ctx" ||
  die "$ENGINE build failed"
new=$("$ENGINE" image inspect --format '{{.Id}}' "$IMAGE")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  "$ENGINE" rmi "$old" >/dev/null 2>&1 || true
fi

size=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
mb=$(((size + 999999) / 1000000))
[ "$mb" -le "$MAX_MB" ] || die "$IMAGE is $mb MB, more than $MAX_MB MB"
echo "build.sh: built $IMAGE, $mb MB"
