#!/usr/bin/env bash
# deps.sh installs everything dualflow needs to build, run and test on a
# fresh Debian machine. It is idempotent and fast when everything is present.
#
#   scripts/deps.sh            # runtime + test deps (apt packages, libchdb, Go modules)
#   DEPS_SKIP_APT=1 scripts/deps.sh   # only libchdb and Go modules (no root needed)
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned exact version of the embedded ClickHouse engine (chDB). Bump with care:
# the schema and HTTP interface are tested against this engine.
CHDB_NPM_PKG="@chdb/lib-linux-x64-gnu"
CHDB_VERSION="${CHDB_VERSION:-26.7.3-stable.1}"
CACHE_DIR="${DUALFLOW_CACHE:-$PWD/.cache}"
CHDB_DIR="$CACHE_DIR/chdb/$CHDB_VERSION"

APT_PACKAGES=(
  # kernel networking lab (issue: lab) and conntrack tooling
  iproute2 nftables conntrack iptables socat netcat-openbsd tcpdump iputils-ping ethtool
  # OVS userspace datapath
  openvswitch-switch
  # packet capture for traceflow
  libpcap-dev
  # browser tests
  chromium
  # the real-API-server test tier: etcd for a kube-apiserver built from source
  etcd-server
  # third-party flow exporters and collector, the judges of NetFlow/IPFIX interop
  softflowd pmacct fprobe nfdump
  # container images built FROM scratch (make image) and run by the e2e tier;
  # runc: crun refuses this kind of machine's hybrid cgroup hierarchy
  podman buildah runc
  containernetworking-plugins ipset
  # flow metrics: promtool checks and unit-tests the shipped alert rules; the
  # real-Prometheus tier runs prometheus and prometheus-alertmanager (their
  # packages do not start the daemons here: policy-rc.d)
  prometheus prometheus-alertmanager
  # misc
  ca-certificates curl
)

PROGRESS_TAG=deps
# shellcheck source=scripts/progress.sh
. scripts/progress.sh

install_apt() {
  if [ "${DEPS_SKIP_APT:-0}" = 1 ]; then return; fi
  # One dpkg-query for all the packages: two processes a package took
  # up to 10 s on a busy machine. It names only the packages dpkg knows.
  local missing=() p status
  local -A installed=()
  while IFS=$'\t' read -r p status; do
    if [ "$status" = "install ok installed" ]; then installed[$p]=1; fi
  done < <(dpkg-query -W -f='${Package}\t${Status}\n' "${APT_PACKAGES[@]}" 2>/dev/null)
  for p in "${APT_PACKAGES[@]}"; do
    [ -n "${installed[$p]:-}" ] || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "apt packages present"; return; fi
  if [ "$(id -u)" != 0 ]; then
    log "missing apt packages (${missing[*]}); re-run as root or install them"; return 1
  fi
  log "installing apt packages (a few minutes on a fresh machine): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  with_progress "apt-get update" "" apt-get -o DPkg::Lock::Timeout=600 update -qq
  with_progress "apt-get install" "" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_chdb() {
  if [ -f "$CHDB_DIR/libchdb.so" ]; then log "libchdb $CHDB_VERSION present"; return; fi
  if ! command -v npm >/dev/null; then
    # The engine ships as an npm package; Debian's npm brings Node.js.
    if [ "$(id -u)" = 0 ] && [ "${DEPS_SKIP_APT:-0}" != 1 ]; then
      log "installing npm (to fetch libchdb)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
    else
      log "npm is required to fetch libchdb (apt-get install npm)"; return 1
    fi
  fi
  log "fetching $CHDB_NPM_PKG@$CHDB_VERSION (about 180 MB, npm verifies its sha512)"
  local tmp; tmp=$(mktemp -d "$CACHE_DIR/.chdb-XXXXXX" 2>/dev/null || { mkdir -p "$CACHE_DIR"; mktemp -d "$CACHE_DIR/.chdb-XXXXXX"; })
  trap 'rm -rf "$tmp"' RETURN
  with_progress "fetching libchdb" "$(npm config get cache 2>/dev/null)/_cacache" \
    bash -c 'cd "$1" && npm pack --silent "$2" >/dev/null' _ "$tmp" "$CHDB_NPM_PKG@$CHDB_VERSION"
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/libchdb.so
  mkdir -p "$CHDB_DIR"
  mv "$tmp/package/libchdb.so" "$CHDB_DIR/libchdb.so"
  ln -sfn "$CHDB_VERSION" "$CACHE_DIR/chdb/current"
  log "libchdb installed at $CHDB_DIR/libchdb.so"
}

install_go() {
  command -v go >/dev/null || { log "go 1.26 is required on the PATH (expected at /usr/local/go/bin)"; return 1; }
  # Quick when the modules are in the cache; on a fresh machine about
  # 500 MB, which takes minutes.
  log "go mod download (first run: a few minutes)"
  with_progress "go mod download" "$(go env GOMODCACHE)/cache/download" go mod download
  log "go modules present"
}

mkdir -p "$CACHE_DIR"
install_apt
install_chdb
ln -sfn "$CHDB_VERSION" "$CACHE_DIR/chdb/current"
install_go
