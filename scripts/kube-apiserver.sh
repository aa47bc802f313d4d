#!/usr/bin/env bash
# kube-apiserver.sh builds the kube-apiserver of the real-API-server test
# tier from the k8s.io/kubernetes Go module pinned in test/kubeapi/tools
# (go.mod + go.sum), once, into .cache/kube-apiserver/<version>/, and
# prints the binary's path on stdout. The first build downloads about 3 GB
# of modules and takes 7 to 15 minutes on 2 cores; later calls return at
# once. Etcd comes from Debian (etcd-server, installed by deps.sh).
#
#   scripts/kube-apiserver.sh          # build if needed, print the path
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=test/kubeapi/tools
VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$TOOLS/go.mod")
[ -n "$VERSION" ] || { echo "kube-apiserver: no k8s.io/kubernetes version in $TOOLS/go.mod" >&2; exit 1; }
CACHE_DIR="${DUALFLOW_CACHE:-$PWD/.cache}"
OUT_DIR="$CACHE_DIR/kube-apiserver/$VERSION"
BIN="$OUT_DIR/kube-apiserver"

log() { printf '[kube-apiserver] %s\n' "$*" >&2; }

if [ -x "$BIN" ]; then
  log "$VERSION present ($BIN)"
  echo "$BIN"; exit 0
fi

minor=${VERSION#v1.}; minor=${minor%%.*}
log "building kube-apiserver $VERSION from k8s.io/kubernetes (first time only: 7-15 minutes on 2 cores, ~3 GB of modules; cached in $OUT_DIR)"
start=$(date +%s)
mkdir -p "$OUT_DIR"
tmp="$OUT_DIR/.kube-apiserver.$$"
trap 'rm -f "$tmp"' EXIT
# -mod=readonly: the build uses exactly the versions go.sum pins.
# GOGC=300: the compiler collects less often (more memory, ~3 GB peak, for
# less CPU); the machine is shared with the unit tier while this runs.
# -gcflags all=-N -l: no optimisation or inlining. The server is a test
# fixture: measured on 2 cores, this takes 12.6 min of CPU instead of 15.2
# (the build dominates a fresh 'make test') and the server is ready in
# 3.8-4.1 s instead of 2.7-3.6 s.
(cd "$TOOLS" && CGO_ENABLED=0 GOGC=300 go build -mod=readonly -trimpath -gcflags 'all=-N -l' -o "$tmp" \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
  k8s.io/kubernetes/cmd/kube-apiserver)
mv "$tmp" "$BIN"
log "built $VERSION in $(( $(date +%s) - start ))s"
echo "$BIN"
