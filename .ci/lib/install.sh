# Shared by the installers in .ci/ (source it): every installer may run
# several times at once (nextest runs each test in its own process, and a
# test that misses a tool runs its installer itself), so each one
#
# - holds a lock on its cache directory for as long as it runs
#   (`lock_cache`), so a second run waits and then finds everything there;
# - makes what it builds appear whole or not at all: a directory that can
#   be moved (node_modules) is built beside its final place and renamed
#   into it (`npm_install_atomically`); a virtualenv, which cannot be moved
#   (its scripts name its absolute path), is rebuilt from nothing unless the
#   stamp that its installer writes last, by rename, says it is complete
#   (`venv_install`);
# - waits for Debian's package lock instead of failing on it
#   (`apt_install`).
#
# Everything goes to stderr: an installer's stdout carries only the
# `export` lines its caller evals.

# Hold an exclusive lock on DIR (created) until the calling script exits.
lock_cache() {
  local dir="$1"
  mkdir -p "$dir"
  exec {BELAY_LOCK_FD}>"$dir/.lock"
  flock "$BELAY_LOCK_FD"
}

# Mark PATH done, atomically (a reader sees no stamp or a whole one).
stamp_done() {
  local stamp="$1"
  : >"$stamp.tmp.$$"
  mv -f "$stamp.tmp.$$" "$stamp"
}

# apt-get install PACKAGES..., waiting up to 10 minutes for dpkg's lock, and
# refreshing the package lists once if a package is not found.
apt_install() {
  command -v apt-get >/dev/null 2>&1 || { echo "apt-get is needed to install $*" >&2; return 1; }
  local apt=(apt-get -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends)
  echo "installing $* from Debian" >&2
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "$@" >&2 && return 0
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "$@" >&2
}

# Make sure node/npm and python3 (with venv) are there.
need_node_and_python() {
  if ! command -v npm >/dev/null 2>&1; then apt_install nodejs npm; fi
  if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    apt_install python3 python3-venv
  fi
}

# venv_install VENV STAMP PIP_ARGS...: unless STAMP exists, make VENV from
# nothing (a half-made one from a killed run is removed first) and
# pip-install PIP_ARGS into it, then write STAMP.
venv_install() {
  local venv="$1" stamp="$2"
  shift 2
  [[ -f "$stamp" && -x "$venv/bin/python" ]] && return 0
  need_node_and_python
  echo "installing $* into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2
  stamp_done "$stamp"
}

# npm_install_atomically DIR STAMP_NAME PACKAGES...: unless DIR/STAMP_NAME
# exists, npm-install PACKAGES into a fresh DIR.tmp.PID, write the stamp in
# it, and rename it to DIR.
npm_install_atomically() {
  local dir="$1" stamp="$2"
  shift 2
  [[ -f "$dir/$stamp" ]] && return 0
  need_node_and_python
  echo "installing $* into $dir" >&2
  local tmp="$dir.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  npm install --prefix "$tmp" --no-audit --no-fund --loglevel=error "$@" >&2
  : >"$tmp/$stamp"
  rm -rf "$dir"
  mv -T "$tmp" "$dir"
}
