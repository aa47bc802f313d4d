#!/usr/bin/env bash
# k8s-cluster.sh builds what the real-cluster tier (test/cluster) runs, once,
# into .cache, and prints KEY=PATH lines on stdout:
#
#   KUBE_APISERVER, KUBELET, KUBE_PROXY, KUBE_CONTROLLER_MANAGER,
#   KUBE_SCHEDULER, KUBECTL   k8s.io/kubernetes at the version pinned in
#                             test/kubeapi/tools/go.mod, built with the flags
#                             of scripts/kube-apiserver.sh (so the Go build
#                             cache is shared): .cache/k8s/<version>/
#   CONTAINERD_DIR            Debian's containerd (containerd, ctr and the
#                             runc shim), unpacked with dpkg -x, never
#                             installed: .cache/containerd/<version>/
#   KUBE_ROUTER               the NetworkPolicy controller, kube-router at
#                             KUBE_ROUTER_VERSION plus
#                             test/cluster/kube-router-ipv6-ipset.patch:
#                             .cache/kube-router/<version>-patched/
#   COREDNS_ARCHIVE           the cluster's DNS, localhost/coredns:<version>,
#                             CoreDNS with the plugins of test/cluster/coredns,
#                             as a docker-archive: .cache/coredns/<version>/
#   HELM                      the helm CLI of the deployment tier (scripts/helm.sh)
#   PAUSE_ARCHIVE             the pod sandbox image, localhost/pause:local,
#                             from the pause.c of the Kubernetes module,
#                             as a docker-archive: .cache/k8s/<version>/
#
#   scripts/k8s-cluster.sh            # everything
#   scripts/k8s-cluster.sh kubectl    # only the named parts (kubelet,
#                                     # kubectl, containerd, kube-router, pause, ...)
#
# Cold, on 2 cores: about 15-25 minutes (kubelet ~10, the others 1-3 each,
# kube-router ~4); then every call returns at once. runc, the CNI plugins
# (bridge, host-local, portmap), ipset and etcd are Debian packages that
# scripts/deps.sh installs.
#
# Container runtime: Debian 12's containerd 1.6.20 speaks the CRI v1 that
# kubelet 1.37 needs; it lacks the RuntimeConfig call, which kubelet 1.38
# and later require (CRILosingSupport "1.38.0"). Moving to 1.38 means
# containerd v2: github.com/containerd/containerd/v2 v2.4.2 builds from its
# Go module (cmd/containerd, cmd/containerd-shim-runc-v2, cmd/ctr; about
# 8 minutes cold) and reads this version-2 config unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=test/kubeapi/tools
VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$TOOLS/go.mod")
[ -n "$VERSION" ] || { echo "k8s-cluster: no k8s.io/kubernetes version in $TOOLS/go.mod" >&2; exit 1; }
CACHE_DIR="${DUALFLOW_CACHE:-$PWD/.cache}"
K8S_DIR="$CACHE_DIR/k8s/$VERSION"
CONTAINERD_VERSION="1.6.20~ds1-1+deb12u3"
CONTAINERD_DIR="$CACHE_DIR/containerd/${CONTAINERD_VERSION//[~+]/_}"
KUBE_ROUTER_VERSION=v2.1.0
KUBE_ROUTER_PATCH=test/cluster/kube-router-ipv6-ipset.patch

log() { printf '[k8s-cluster] %s\n' "$*" >&2; }

minor=${VERSION#v1.}; minor=${minor%%.*}
k8s_binary() { # NAME
  local name=$1 bin="$K8S_DIR/$1"
  if [ "$name" = kube-apiserver ]; then
    bin=$(scripts/kube-apiserver.sh)
  elif [ ! -x "$bin" ]; then
    log "building $name $VERSION from k8s.io/kubernetes (first time only; cached in $K8S_DIR)"
    local start=$SECONDS tmp="$K8S_DIR/.$name.$$"
    mkdir -p "$K8S_DIR"
    # The flags of scripts/kube-apiserver.sh: the same Go build cache.
    (cd "$TOOLS" && CGO_ENABLED=0 GOGC=300 go build -mod=readonly -trimpath -gcflags 'all=-N -l' -o "$tmp" \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      "k8s.io/kubernetes/cmd/$name") || { rm -f "$tmp"; exit 1; }
    mv "$tmp" "$bin"
    log "built $name in $((SECONDS - start))s"
  fi
  local key=${name^^}; echo "${key//-/_}=$bin"
}

containerd() {
  if [ ! -x "$CONTAINERD_DIR/usr/bin/containerd" ]; then
    log "fetching Debian's containerd $CONTAINERD_VERSION (apt-get download; unpacked, not installed)"
    local tmp; tmp=$(mktemp -d); chmod 755 "$tmp" # apt's _apt user writes there
    (cd "$tmp" && apt-get download -qq "containerd=$CONTAINERD_VERSION") || { rm -rf "$tmp"; log "apt-get download containerd=$CONTAINERD_VERSION failed"; exit 1; }
    mkdir -p "$CONTAINERD_DIR.tmp"
    dpkg -x "$tmp"/containerd_*.deb "$CONTAINERD_DIR.tmp"
    rm -rf "$tmp" "$CONTAINERD_DIR"
    mv "$CONTAINERD_DIR.tmp" "$CONTAINERD_DIR"
  fi
  echo "CONTAINERD_DIR=$CONTAINERD_DIR"
}

kube_router() {
  # The cache is keyed by the patch: a changed patch builds again.
  local KUBE_ROUTER_DIR; KUBE_ROUTER_DIR="$CACHE_DIR/kube-router/$KUBE_ROUTER_VERSION-patched-$(sha256sum <"$KUBE_ROUTER_PATCH" | cut -c1-12)"
  local bin="$KUBE_ROUTER_DIR/kube-router"
  if [ ! -x "$bin" ]; then
    log "building kube-router $KUBE_ROUTER_VERSION with $KUBE_ROUTER_PATCH (first time only: about 4 minutes)"
    local start=$SECONDS src
    src=$(go mod download -json "github.com/cloudnativelabs/kube-router/v2@$KUBE_ROUTER_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src" ] || { log "go mod download kube-router failed"; exit 1; }
    rm -rf "$KUBE_ROUTER_DIR.src"; mkdir -p "$KUBE_ROUTER_DIR"
    cp -r "$src" "$KUBE_ROUTER_DIR.src"; chmod -R u+w "$KUBE_ROUTER_DIR.src"
    patch -s -d "$KUBE_ROUTER_DIR.src" -p1 <"$KUBE_ROUTER_PATCH"
    (cd "$KUBE_ROUTER_DIR.src" && CGO_ENABLED=0 GOGC=300 GOFLAGS=-mod=mod go build -trimpath -gcflags 'all=-N -l' \
      -ldflags "-s -w" -o "$bin.tmp" ./cmd/kube-router) || { rm -f "$bin.tmp"; exit 1; }
    mv "$bin.tmp" "$bin"; rm -rf "$KUBE_ROUTER_DIR.src"
    log "built kube-router in $((SECONDS - start))s"
  fi
  echo "KUBE_ROUTER=$bin"
}

# scratch_image DIR NAME ARCHIVE CONFIG-FLAGS...: an image FROM scratch with
# DIR's files at /, configured by buildah config's flags, written as a
# docker-archive that containerd imports (ctr images import), on the
# project's private container storage (scripts/image.sh buildah).
scratch_image() {
  local dir=$1 name=$2 archive=$3; shift 3
  local c; c=$(scripts/image.sh buildah from scratch)
  scripts/image.sh buildah copy "$c" "$dir" / >/dev/null
  scripts/image.sh buildah config "$@" "$c"
  scripts/image.sh buildah commit -q --rm "$c" "$name" >/dev/null
  rm -f "$archive"
  scripts/image.sh buildah push -q "$name" "docker-archive:$archive:$name"
}

pause() {
  local archive="$K8S_DIR/pause.tar"
  if [ ! -s "$archive" ]; then
    log "building the pause image localhost/pause:local from the pause.c of k8s.io/kubernetes@$VERSION"
    local src; src=$(cd "$TOOLS" && go list -mod=readonly -m -f '{{.Dir}}' k8s.io/kubernetes)
    [ -n "$src" ] && [ -f "$src/build/pause/linux/pause.c" ] || (cd "$TOOLS" && go mod download k8s.io/kubernetes)
    src=$(cd "$TOOLS" && go list -mod=readonly -m -f '{{.Dir}}' k8s.io/kubernetes)
    local tmp; tmp=$(mktemp -d); mkdir -p "$K8S_DIR"
    gcc -Os -Wall -Werror -static -DVERSION="$VERSION-dualflow" -o "$tmp/pause" "$src/build/pause/linux/pause.c"
    scratch_image "$tmp" localhost/pause:local "$archive.tmp" --entrypoint '["/pause"]' --user 65535:65535
    mv "$archive.tmp" "$archive"; rm -rf "$tmp"
  fi
  echo "PAUSE_ARCHIVE=$archive"
}

coredns() {
  local mod=test/cluster/coredns v
  v=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' "$mod/go.mod")
  local dir="$CACHE_DIR/coredns/$v" archive
  archive="$dir/coredns.tar"
  if [ ! -s "$archive" ]; then
    log "building CoreDNS $v (first time only: a few minutes)"
    local start=$SECONDS tmp; tmp=$(mktemp -d); mkdir -p "$dir"
    (cd "$mod" && CGO_ENABLED=0 GOGC=300 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/coredns" .) || { rm -rf "$tmp"; exit 1; }
    scratch_image "$tmp" "localhost/coredns:$v" "$archive.tmp" --entrypoint '["/coredns"]' --user 65532:65532
    mv "$archive.tmp" "$archive"; rm -rf "$tmp"
    log "built CoreDNS in $((SECONDS - start))s"
  fi
  echo "COREDNS_ARCHIVE=$archive"
  echo "COREDNS_IMAGE=localhost/coredns:$v"
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(kube-apiserver kubectl kube-proxy kube-scheduler kube-controller-manager kubelet containerd kube-router pause coredns helm)
for p in "${parts[@]}"; do
  case $p in
    containerd) containerd ;;
    kube-router) kube_router ;;
    pause) pause ;;
    coredns) coredns ;;
    helm) echo "HELM=$(scripts/helm.sh)" ;;
    kube-apiserver|kubelet|kube-proxy|kube-controller-manager|kube-scheduler|kubectl) k8s_binary "$p" ;;
    *) log "unknown part $p"; exit 2 ;;
  esac
done
