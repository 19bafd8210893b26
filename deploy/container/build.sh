#!/usr/bin/env bash
# Builds the images localhost/belay-engine:TAG and localhost/belay-worker:TAG
# with podman from binaries built beforehand, onto the Debian minbase of
# base.sh (nothing is pulled). Prints the build time and the image sizes.
#
#   deploy/container/build.sh [--bin-dir DIR] [--tag TAG] [--no-strip]
#
#   --bin-dir  where belay-engine, belay-worker and belay are
#              (default: $CARGO_TARGET_DIR/release, else target/release);
#              the CI's debug binaries are fine for the smoke test
#   --tag      image tag (default: dev)
#   --no-strip copy the binaries as they are (default: debug info is
#              stripped, as a release image would have it)
#
# With a registry, build from the repository instead (see the Containerfile).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/tools.sh"

bin_dir="${CARGO_TARGET_DIR:-$here/../../target}/release"
tag=dev
strip=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --no-strip) strip=0; shift ;;
    *) echo "build.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
for bin in belay-engine belay-worker belay; do
  [[ -x "$bin_dir/$bin" ]] || {
    echo "build.sh: $bin_dir/$bin is missing: build it first (cargo build --workspace --bins [--release])" >&2
    exit 1
  }
done

start=$(date +%s%N)
base="$("$here/base.sh")"

context="$(mktemp -d "${TMPDIR:-/tmp}/belay-image.XXXXXX")"
trap 'rm -rf "$context"' EXIT
mkdir "$context/bin"
for bin in belay-engine belay-worker belay; do
  if [[ $strip == 1 ]]; then
    objcopy --strip-debug "$bin_dir/$bin" "$context/bin/$bin"
  else
    cp "$bin_dir/$bin" "$context/bin/$bin"
  fi
done

for target in engine worker; do
  podman build --quiet --format docker -f "$here/Containerfile" --target "$target" \
    --build-arg BINARIES=prebuilt --build-arg RUNTIME="$base" \
    -t "localhost/belay-$target:$tag" "$context" >&2
done
end=$(date +%s%N)

ms=$(((end - start) / 1000000))
printf 'built in %d.%01d s (base image included when it was made)\n' $((ms / 1000)) $((ms % 1000 / 100))
for target in engine worker; do
  size=$(podman image inspect --format '{{.Size}}' "localhost/belay-$target:$tag")
  printf 'localhost/belay-%s:%s  %d MB\n' "$target" "$tag" $((size / 1000000))
done
printf 'base %s  %d MB\n' "$base" $(($(podman image inspect --format '{{.Size}}' "$base") / 1000000))
