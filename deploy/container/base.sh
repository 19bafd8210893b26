#!/usr/bin/env bash
# Makes the runtime base image `localhost/belay-base:bookworm` where no image
# can be pulled: a Debian bookworm minbase made with debootstrap (from the
# Debian archive, like any apt install), trimmed of docs, man pages, locales
# and apt's lists, imported with `podman import`. Idempotent: the root file
# system is cached as a tarball under $BELAY_IMAGE_CACHE
# (~/.cache/belay-images) and the image is imported only when podman lacks it.
#
#   deploy/container/base.sh            # prints the image name
#
# Everything but the image name goes to stderr. Users with a registry do not
# need this: the Containerfile's default runtime is
# gcr.io/distroless/cc-debian12:nonroot.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/tools.sh"
need debootstrap debootstrap

image=localhost/belay-base:bookworm
cache="${BELAY_IMAGE_CACHE:-$HOME/.cache/belay-images}"
mirror="${BELAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
tarball="$cache/bookworm-minbase.tar"
mkdir -p "$cache"


if podman image exists "$image"; then
  echo "$image"
  exit 0
fi

if [[ ! -s "$tarball" ]]; then
  root="$(mktemp -d "$cache/rootfs.XXXXXX")"
  trap 'rm -rf "$root"' EXIT
  echo "debootstrap --variant=minbase bookworm into $root" >&2
  # ca-certificates: the system trust store that https:// engine URLs,
  # model providers and HTTP tools are verified against.
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$mirror" >&2
  rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
    "$root"/var/log/*
  tar -C "$root" --numeric-owner -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi
echo "importing $tarball as $image" >&2
podman import --change 'CMD ["/bin/bash"]' "$tarball" "$image" >&2
echo "$image"
