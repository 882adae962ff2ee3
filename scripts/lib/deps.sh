# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced helper: spindle_install_deps installs the Debian 12 packages spindle needs to build,
# test and benchmark, and only those that are missing. spindle_install_cross_deps (below) adds what
# the aarch64 cross build needs.
#
# Usage:  source scripts/lib/deps.sh && spindle_install_deps [&& spindle_install_cross_deps]
# Errors: returns non-zero (and names the missing packages) when dpkg-query is absent, or when
#         packages are missing and we are neither root nor able to use sudo, or apt-get fails.
# Set SPINDLE_SKIP_DEPS=1 to skip the check entirely (non-Debian hosts, pre-baked images).

SPINDLE_DEB_PACKAGES=(
  build-essential g++ clang libclang-rt-14-dev cmake ninja-build pkg-config
  liburing-dev libhwloc-dev hwloc
  libgtest-dev libgmock-dev libbenchmark-dev
  libboost-context-dev libboost-fiber-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev python3 libunwind-dev gdb
  libdpdk-dev iproute2 iputils-ping ethtool
  media-types curl wget nginx-light
  libisal-dev redis-tools redis-server python3-redis
  doxygen help2man python3-matplotlib
)

# Prints, on one line, those of the named packages that dpkg does not list as installed.
spindle_missing_packages() {
  local pkg status
  local -a missing=()
  for pkg in "$@"; do
    # "install ok installed" or "hold ok installed"; anything else (or no such package) is missing.
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == *" ok installed"* ]] || missing+=("$pkg")
  done
  echo "${missing[*]}"
}

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

  local -a missing=()
  read -ra missing <<<"$(spindle_missing_packages "${SPINDLE_DEB_PACKAGES[@]}")"

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

# spindle_install_cross_deps installs what the aarch64 flavour needs on an x86-64 Debian 12 host: the GCC
# cross compiler, qemu-user to run the tests, and the arm64 builds of the libraries spindle links. It adds
# arm64 as a dpkg foreign architecture when it is not one yet, runs apt-get update only when that is needed
# (the architecture was just added, or a missing package has no install candidate), and installs only what
# is missing. Host tools (cmake, ninja, pkg-config) come from spindle_install_deps.
# Errors: as spindle_install_deps; also when dpkg --add-architecture fails. SPINDLE_SKIP_DEPS=1 skips it.

SPINDLE_CROSS_ARCH=arm64
SPINDLE_CROSS_DEB_PACKAGES=(
  g++-aarch64-linux-gnu qemu-user
  liburing-dev:arm64 libhwloc-dev:arm64
  libgtest-dev:arm64 libgmock-dev:arm64
  libfmt-dev:arm64 libcli11-dev libunwind-dev:arm64
)

spindle_install_cross_deps() {
  if [[ "${SPINDLE_SKIP_DEPS:-0}" == 1 ]]; then
    echo "deps(cross): SPINDLE_SKIP_DEPS=1, not checking packages"
    return 0
  fi
  if ! command -v dpkg >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps(cross): error: dpkg not found; this helper targets Debian 12." >&2
    echo "deps(cross): install these yourself, then rerun with SPINDLE_SKIP_DEPS=1:" \
      "${SPINDLE_CROSS_DEB_PACKAGES[*]}" >&2
    return 1
  fi

  local -a priv=()
  if [[ "$(id -u)" != 0 ]] && command -v sudo >/dev/null 2>&1; then
    priv=(sudo)
  fi
  local can_install=1
  [[ "$(id -u)" == 0 || ${#priv[@]} -gt 0 ]] || can_install=0

  local need_update=0 foreign
  foreign=$(dpkg --print-foreign-architectures)
  if [[ $'\n'"$foreign"$'\n' != *$'\n'"$SPINDLE_CROSS_ARCH"$'\n'* ]]; then
    if ((!can_install)); then
      echo "deps(cross): error: dpkg architecture $SPINDLE_CROSS_ARCH is not enabled, and we are neither" \
        "root nor able to use sudo" >&2
      echo "deps(cross): as root, run: dpkg --add-architecture $SPINDLE_CROSS_ARCH && apt-get update" \
        "&& apt-get install -y --no-install-recommends ${SPINDLE_CROSS_DEB_PACKAGES[*]}" >&2
      return 1
    fi
    echo "deps(cross): adding dpkg architecture $SPINDLE_CROSS_ARCH" >&2
    if ! "${priv[@]}" dpkg --add-architecture "$SPINDLE_CROSS_ARCH"; then
      echo "deps(cross): error: dpkg --add-architecture $SPINDLE_CROSS_ARCH failed" >&2
      return 1
    fi
    need_update=1
  fi

  local pkg
  local -a missing=()
  read -ra missing <<<"$(spindle_missing_packages "${SPINDLE_CROSS_DEB_PACKAGES[@]}")"

  if ((${#missing[@]} == 0)); then
    echo "deps(cross): nothing missing (${#SPINDLE_CROSS_DEB_PACKAGES[@]} packages already installed)"
    return 0
  fi
  if ((!can_install)); then
    echo "deps(cross): error: not root and sudo is not available; missing packages: ${missing[*]}" >&2
    echo "deps(cross): as root, run: apt-get update &&" \
      "apt-get install -y --no-install-recommends ${missing[*]}" >&2
    return 1
  fi

  # Package lists that predate the architecture (or are simply old) know no candidate for a package.
  if ((!need_update)); then
    for pkg in "${missing[@]}"; do
      if ! apt-cache policy "$pkg" 2>/dev/null | grep -qE '^ *Candidate: [^(]'; then
        need_update=1
        break
      fi
    done
  fi

  echo "deps(cross): installing ${#missing[@]} missing package(s): ${missing[*]}" >&2
  if ((need_update)) && ! "${priv[@]}" apt-get update; then
    echo "deps(cross): error: apt-get update failed; missing packages: ${missing[*]}" >&2
    return 1
  fi
  if ! "${priv[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y --no-install-recommends "${missing[@]}"; then
    # Lists that name a candidate can still point at files the mirror no longer has: refresh once, retry.
    if ((need_update)) || ! "${priv[@]}" apt-get update || ! "${priv[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}"; then
      echo "deps(cross): error: apt-get install failed; missing packages: ${missing[*]}" >&2
      return 1
    fi
  fi
  echo "deps(cross): installed ${missing[*]}"
}
