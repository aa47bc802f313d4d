#!/usr/bin/env bash
# helm.sh builds the helm CLI of the deployment tier from the helm.sh/helm
# module pinned in test/deploy/render (go.mod + go.sum: the version whose
# libraries the renderer uses, and the CLI as a `tool` of that module), once,
# into .cache/helm/<version>/, and prints the binary's path on stdout. The
# first build takes 5 minutes on 2 idle cores, 20 on loaded ones (it shares
# client-go and the Kubernetes API packages with the renderer's build
# cache); later calls return at once. v4.3.2 rather than v3: the machine's
# package list approves it, and Helm 4 is what an operator gets today; the
# chart (apiVersion v2) installs with Helm 3.17 and later too.
#
#   scripts/helm.sh          # build if needed, print the path
set -euo pipefail
cd "$(dirname "$0")/.."

MOD=test/deploy/render
VERSION=$(awk '$1 == "helm.sh/helm/v4" {print $2; exit}' "$MOD/go.mod")
[ -n "$VERSION" ] || { echo "helm: no helm.sh/helm/v4 version in $MOD/go.mod" >&2; exit 1; }
CACHE_DIR="${DUALFLOW_CACHE:-$PWD/.cache}"
OUT_DIR="$CACHE_DIR/helm/$VERSION"
BIN="$OUT_DIR/helm"

log() { printf '[helm] %s\n' "$*" >&2; }

if [ -x "$BIN" ]; then
  log "$VERSION present ($BIN)"
  echo "$BIN"; exit 0
fi

log "building helm $VERSION from helm.sh/helm/v4 (first time only: a few minutes on 2 cores; cached in $OUT_DIR)"
start=$(date +%s)
mkdir -p "$OUT_DIR"
tmp="$OUT_DIR/.helm.$$"
trap 'rm -f "$tmp"' EXIT
# -mod=readonly: exactly the versions go.sum pins. The version is what
# Helm's own release build stamps (its Makefile's LDFLAGS), so that
# `helm version` and the User-Agent name it.
(cd "$MOD" && CGO_ENABLED=0 go build -mod=readonly -trimpath -o "$tmp" \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$VERSION -X helm.sh/helm/v4/internal/version.metadata=" \
  helm.sh/helm/v4/cmd/helm)
mv "$tmp" "$BIN"
log "built $VERSION in $(( $(date +%s) - start ))s"
echo "$BIN"
