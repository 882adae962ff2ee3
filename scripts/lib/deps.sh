# shellcheck shell=bash
# Sourced helper: spindle_install_deps installs the Debian 12 packages spindle needs to build,
# test and benchmark, and only those that are missing.
#
# Usage:  source scripts/lib/deps.sh && spindle_install_deps
# Errors: returns non-zero (and names the missing packages) when dpkg-query is absent, or when
#         packages are missing and we are neither root nor able to use sudo, or apt-get fails.
# Set SPINDLE_SKIP_DEPS=1 to skip the check entirely (non-Debian hosts, pre-baked images).

SPINDLE_DEB_PACKAGES=(
  build-essential g++ clang libclang-rt-14-dev cmake ninja-build pkg-config
  liburing-dev libhwloc-dev hwloc
  libgtest-dev libgmock-dev libbenchmark-dev
  libboost-context-dev libboost-fiber-dev
  libfmt-dev libcli11-dev
)

spindle_install_deps() {
  if [[ "${SPINDLE_SKIP_DEPS:-0}" == 1 ]]; then
    echo "deps: SPINDLE_SKIP_DEPS=1, not checking packages"
    return 0
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps: error: dpkg-query not found; this helper targets Debian 12." >&2
    echo "deps: install these yourself, then rerun with SPINDLE_SKIP_DEPS=1: ${SPINDLE_DEB_PACKAGES[*]}" >&2
    return 1
  fi

  local pkg status
  local -a missing=()
  for pkg in "${SPINDLE_DEB_PACKAGES[@]}"; do
    # "install ok installed" or "hold ok installed"; anything else (or no such package) is missing.
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == *" ok installed"* ]] || missing+=("$pkg")
  done

  if ((${#missing[@]} == 0)); then
    echo "deps: nothing missing (${#SPINDLE_DEB_PACKAGES[@]} packages already installed)"
    return 0
  fi

  local -a priv=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      priv=(sudo)
    else
      echo "deps: error: not root and sudo is not available; missing packages: ${missing[*]}" >&2
      echo "deps: as root, run: apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
      return 1
    fi
  fi

  echo "deps: installing ${#missing[@]} missing package(s): ${missing[*]}" >&2
  if ! "${priv[@]}" apt-get update; then
    echo "deps: error: apt-get update failed; missing packages: ${missing[*]}" >&2
    return 1
  fi
  # `env` carries DEBIAN_FRONTEND through sudo, which would otherwise drop it.
  if ! "${priv[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y --no-install-recommends "${missing[@]}"; then
    echo "deps: error: apt-get install failed; missing packages: ${missing[*]}" >&2
    return 1
  fi
  echo "deps: installed ${missing[*]}"
}
