# Sourced by base.sh, build.sh and smoke.sh: installs what they run from
# Debian when it is missing (idempotent: nothing happens when it is there)
# and points podman at containers.conf (runc, ulimits that fit a container
# without systemd).
here="${here:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

# need COMMAND PACKAGE: apt-get install PACKAGE unless COMMAND is on PATH.
need() {
  command -v "$1" >/dev/null 2>&1 && return
  echo "installing $2 from Debian" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2 ||
    { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2; }
}
need podman podman
need runc runc
