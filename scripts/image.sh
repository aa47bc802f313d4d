#!/usr/bin/env bash
# image.sh builds dualflow's OCI images FROM scratch, offline (no base image,
# no registry), with buildah, into a private container storage under
# .cache/containers, so that nothing touches the machine's global storage.
#
#   scripts/image.sh                  # build dualflow:<tag> and dualflow-chdb:<tag>
#   scripts/image.sh podman ARGS...   # podman on the private storage (run, images, rmi, ...)
#   scripts/image.sh buildah ARGS...  # buildah on the private storage
#   scripts/image.sh push REGISTRY [TAG] [PODMAN-PUSH-FLAGS...]
#                                     # push both images to REGISTRY/dualflow:TAG and
#                                     # REGISTRY/dualflow-chdb:TAG (default: the build tag)
#   scripts/image.sh tags             # print the tags a build gives (build, release)
#
# Environment: VERSION, COMMIT (as make build), IMAGE_TAG (default VERSION),
# IMAGE_ARCHIVE=0 to skip the OCI archives in var/image, DUALFLOW_CONTAINERS
# (default .cache/containers: storage, run root and podman's tmpdir);
# REGISTRY_AUTH_FILE for push (default: podman's, from `scripts/image.sh
# podman login REGISTRY`).
#
# Tags: the build tag (IMAGE_TAG, default VERSION: git describe, one per
# commit) and, when IMAGE_TAG is not set, the release tag the manifests pin
# (the Helm chart's appVersion, which deploy/kubernetes/overlays' images
# repeat). Push the build tag and pin it: a tag pushed again with other
# content is never pulled again by a node that has it (IfNotPresent).
#
# Only linux/amd64: the image carries the build host's glibc, nft and OVS
# binaries with their libraries, and libchdb for x86-64 (docs/deploy.md).
#
# /licenses holds the terms of everything copied in: the Debian copyright
# file of every package a file comes from (glibc, nftables, Open vSwitch
# and their libraries, ca-certificates), the licences of the Go modules
# linked into the binary and of the UI's vendored scripts, and (in
# dualflow-chdb) chDB's. The OCI labels name them (org.opencontainers.image.licenses).
#
# Two images, the second built on the first so that they share its layers:
#   dualflow:<tag>       the binary, the glibc files it needs (purego's
#                        fakecgo links it dynamically: ld.so, libc, libdl,
#                        libpthread), CA certificates, /etc/passwd and
#                        /etc/group with user nonroot (65532), the default
#                        user, and the node agent's nft, ovs-appctl and
#                        ovs-ofctl. About 110 MB: the exporter DaemonSet (every
#                        node), the web, and the collector on a ClickHouse
#                        server (--clickhouse.dsn).
#   dualflow-chdb:<tag>  plus the pinned libchdb.so (about 570 MB) and the
#                        libraries it needs (libm, librt), CHDB_LIB_PATH set:
#                        the collector with the embedded store. Kept apart so
#                        that no node pulls 570 MB it never loads.
# Both need root (or buildah unshare) only for the private storage's mounts.
set -euo pipefail
cd "$(dirname "$0")/.."

# Resolved: libpod's database records the path it was made with, and
# refuses another one to the same storage (a .cache reached through a
# symbolic link, as git worktrees sharing one .cache have).
STORE="$(realpath -m "${DUALFLOW_CONTAINERS:-$PWD/.cache/containers}")"
# The storage driver: overlay (the kernel has it) shares layers between
# images and containers; vfs works anywhere at the cost of copies.
DRIVER="${STORAGE_DRIVER:-overlay}"
STORE_FLAGS=(--root "$STORE/storage" --runroot "$STORE/run" --storage-driver "$DRIVER")

bah() { buildah "${STORE_FLAGS[@]}" "$@"; }
# No systemd on the test machines, and none needed: cgroupfs, file events,
# libpod's state (tmpdir) next to the storage, and a private containers.conf
# for what sandboxed machines (root without CAP_SYS_RESOURCE, cgroup v1+v2
# hybrid) need:
#  - podman as root gives containers nofile and nproc limits of 1048576,
#    which the runtime cannot set without CAP_SYS_RESOURCE; when podman
#    fails to raise its own nproc it falls back to 32768, so the containers
#    get this shell's hard limits, nproc capped at that;
#  - crun refuses a hybrid cgroup hierarchy (v1 controllers plus one on
#    v2, "cgroups in hybrid mode not supported", even with --cgroups
#    disabled): runc, which handles it, is the runtime there.
pod() {
  mkdir -p "$STORE"
  local nofile nproc runtime=crun
  nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  if [ "$nofile" = unlimited ]; then nofile=1048576; fi
  if [ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ]; then runtime=runc; fi
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
    "$nofile" "$nofile" "$nproc" "$nproc" >"$STORE/containers.conf"
  CONTAINERS_CONF="$STORE/containers.conf" podman "${STORE_FLAGS[@]}" --runtime "$runtime" --tmpdir "$STORE/tmp" \
    --cgroup-manager cgroupfs --events-backend file "$@"
}

log() { printf '[image] %s\n' "$*" >&2; }

VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
COMMIT="${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
TAG="${IMAGE_TAG:-$VERSION}"
TAG="${TAG//[^A-Za-z0-9_.-]/-}" # a tag is [A-Za-z0-9_.-]
# The release tag: the chart's appVersion, which the manifests pin.
RELEASE=$(awk -F'"' '/^appVersion:/ {print $2}' deploy/helm/dualflow/Chart.yaml)
[ -n "$RELEASE" ] || { log "no appVersion in deploy/helm/dualflow/Chart.yaml"; exit 1; }
TAGS=("$TAG")
if [ -z "${IMAGE_TAG:-}" ] && [ "$RELEASE" != "$TAG" ]; then TAGS+=("$RELEASE"); fi

case "${1:-}" in
  podman) shift; mkdir -p "$STORE"; pod "$@"; exit ;;
  buildah) shift; mkdir -p "$STORE"; bah "$@"; exit ;;
  tags) echo "${TAGS[*]}"; exit ;;
  push)
    # The images live in the private storage, which the machine's podman
    # does not see: push from it. Log in first with
    # `scripts/image.sh podman login REGISTRY` (or set REGISTRY_AUTH_FILE).
    # Flags after the tag go to podman push (--tls-verify=false, --creds).
    [ -n "${2:-}" ] || { echo "usage: $0 push REGISTRY [TAG] [PODMAN-PUSH-FLAGS...]" >&2; exit 2; }
    reg=${2%/} tag=$TAG
    shift 2
    if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then tag=$1; shift; fi
    for img in dualflow dualflow-chdb; do
      log "push localhost/$img:$tag -> $reg/$img:$tag"
      pod push "$@" "localhost/$img:$tag" "docker://$reg/$img:$tag"
    done
    exit ;;
  "") ;;
  *) echo "usage: $0 [podman|buildah ARGS...|push REGISTRY [TAG]|tags]" >&2; exit 2 ;;
esac

for tool in buildah tar; do
  command -v "$tool" >/dev/null || { log "$tool is missing (make deps installs it)"; exit 1; }
done
CHDB_LIB="${CHDB_LIB_PATH:-$PWD/.cache/chdb/current/libchdb.so}"
CHDB_LIB="$(readlink -f "$CHDB_LIB")"
[ -f "$CHDB_LIB" ] || { log "libchdb not found at $CHDB_LIB (make deps)"; exit 1; }
# Files and the images' creation time from the commit: same commit, same layers.
EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
NONROOT=65532

WORK="$PWD/var/image"
rm -rf "$WORK/base" "$WORK/chdb" "$WORK/base.files" "$WORK/chdb.files"
mkdir -p "$WORK/base" "$WORK/chdb" "$STORE"

# The binary: make build's flags plus -s -w (no symbol table or DWARF: a
# third smaller; panics still print file:line). Only the link step differs
# from make build, so no package is compiled again.
log "go build (stripped) -> $WORK/dualflow"
CGO_ENABLED=0 go build -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" -o "$WORK/dualflow" ./cmd/dualflow

# copy_libs ROOT ELF: copies ELF's program interpreter and the shared
# libraries ldd resolves for it, the exact host files, to the same paths
# under ROOT (symlinks resolved), skipping those already in SKIP (a root).
# Each copied host file is listed in ROOT.files, for its licence.
copy_libs() {
  local root=$1 elf=$2 skip=${3:-} p
  for p in $(ldd "$elf" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
    if [ -n "$skip" ] && [ -e "$skip$p" ]; then continue; fi
    mkdir -p "$root$(dirname "$p")"
    cp -L "$p" "$root$p"
    echo "$p" >>"$root.files"
  done
}

# debian_licenses ROOT [SKIP] [PACKAGE...]: the Debian copyright file of
# every package that owns a host file listed in ROOT.files (and of each
# PACKAGE), to ROOT/licenses/debian/PACKAGE/copyright, skipping those
# already in SKIP (a root).
debian_licenses() {
  local root=$1 skip=${2:-} f owner pkg
  shift; shift || true
  {
    printf '%s\n' "$@"
    sort -u "$root.files" | while read -r f; do
      owner=$(dpkg -S "$f" 2>/dev/null || dpkg -S "$(readlink -f "$f")" 2>/dev/null) || { log "no Debian package owns $f: its licence is unknown"; exit 1; }
      echo "${owner%%:*}" # "libc6:amd64: /lib/..." or "nftables: /usr/sbin/nft"
    done
  } | sort -u | while read -r pkg; do
    [ -n "$pkg" ] || continue
    if [ -n "$skip" ] && [ -e "$skip/licenses/debian/$pkg" ]; then continue; fi
    [ -e "/usr/share/doc/$pkg/copyright" ] || { log "/usr/share/doc/$pkg/copyright is missing"; exit 1; }
    install -D -m 0644 "/usr/share/doc/$pkg/copyright" "$root/licenses/debian/$pkg/copyright"
  done
}

# Base layer.
b="$WORK/base"
install -D -m 0755 "$WORK/dualflow" "$b/usr/bin/dualflow"
copy_libs "$b" "$WORK/dualflow"
[ -e "$b/lib64/ld-linux-x86-64.so.2" ] || { log "the binary's loader was not found by ldd"; exit 1; }
# (made by update-ca-certificates from package ca-certificates' files)
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$b/etc/ssl/certs/ca-certificates.crt"
# The node agent's tools: nft (kernel-datapath traceflow: trace tables and
# `nft monitor trace`), ovs-appctl and ovs-ofctl (the OVS source and
# OVS-datapath traceflow), the host's files with their libraries. Each must
# run inside the image's root, checked here.
for tool in nft ovs-appctl ovs-ofctl; do
  p=$(command -v "$tool") || { log "$tool not found (scripts/deps.sh installs nftables and openvswitch-switch)"; exit 1; }
  p=$(readlink -f "$p")
  install -D -m 0755 "$p" "$b$p"
  echo "$p" >>"$b.files"
  copy_libs "$b" "$p"
  chroot "$b" "$p" --version >/dev/null || { log "$tool does not run inside the image"; exit 1; }
done
mkdir -p "$b/etc"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n' $NONROOT $NONROOT >"$b/etc/passwd"
printf 'root:x:0:\nnonroot:x:%d:\n' $NONROOT >"$b/etc/group"
chmod 0644 "$b/etc/passwd" "$b/etc/group"
mkdir -p "$b/root" "$b/tmp" "$b/home/nonroot" "$b/var/lib/dualflow"
chmod 0700 "$b/root" "$b/home/nonroot" "$b/var/lib/dualflow"
chmod 1777 "$b/tmp"
# Licences: the Debian packages' copyright files, every Go module linked in
# (its LICENSE, COPYING and NOTICE files) and Go's own, the UI's vendored
# scripts, and dualflow's (the repository's LICENSE, when it has one).
debian_licenses "$b" "" ca-certificates
CGO_ENABLED=0 go list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}}@{{.Version}} {{.Dir}}{{end}}{{end}}' ./cmd/dualflow |
  sort -u | while read -r mod dir; do
    n=0
    for f in "$dir"/LICENSE* "$dir"/LICENCE* "$dir"/COPYING* "$dir"/NOTICE* "$dir"/PATENTS; do
      [ -f "$f" ] || continue
      install -D -m 0644 "$f" "$b/licenses/go/$mod/$(basename "$f")"
      n=$((n + 1))
    done
    [ "$n" -gt 0 ] || log "warning: Go module $mod has no licence file"
  done
install -D -m 0644 "$(go env GOROOT)/LICENSE" "$b/licenses/go/go@$(go env GOVERSION)/LICENSE"
for f in web/ui/static/vendor/*.LICENSE; do install -D -m 0644 "$f" "$b/licenses/web/$(basename "$f")"; done
if [ -f LICENSE ]; then install -D -m 0644 LICENSE "$b/licenses/dualflow/LICENSE"; fi
cat >"$b/licenses/README" <<EOT
dualflow $VERSION ($COMMIT), linux/amd64, and what it carries:

  usr/bin/dualflow   dualflow, with the Go modules in go/ linked in and
                     the UI scripts in web/ embedded
  nft                nftables (GPL-2), with its libraries
  ovs-appctl,        Open vSwitch (Apache-2.0, parts LGPL-2.1 and others),
  ovs-ofctl          with its libraries
  lib*, ld.so        the GNU C library (LGPL-2.1+) and the libraries above
  CA certificates    ca-certificates (MPL-2.0)

debian/PACKAGE/copyright  the Debian copyright file of every package a file
                          comes from: the authoritative terms. Their source
                          is Debian's, at the versions of $(. /etc/os-release && echo "$PRETTY_NAME")
                          the image was built on (libc6 $(dpkg-query -W -f '${Version}' libc6)).
go/MODULE@VERSION/        each Go module's licence files; go@VERSION is Go's.
web/                      the UI's vendored scripts (cytoscape, uPlot).
dualflow/                 dualflow's own licence, when its repository has one.
EOT
chmod 0644 "$b/licenses/README"

# Embedded-store layer: libchdb and what it needs beyond the base.
c="$WORK/chdb"
install -D -m 0644 "$CHDB_LIB" "$c/usr/lib/dualflow/libchdb.so"
copy_libs "$c" "$CHDB_LIB" "$b"
touch "$c.files"
debian_licenses "$c" "$b"
# libchdb.so is chDB's build for linux x86-64 (npm @chdb/lib-linux-x64-gnu,
# the version scripts/deps.sh pins): Apache-2.0, as the ClickHouse it embeds.
install -D -m 0644 /usr/share/common-licenses/Apache-2.0 "$c/licenses/chdb/LICENSE"
printf 'usr/lib/dualflow/libchdb.so: chDB %s (https://github.com/chdb-io/chdb, npm @chdb/lib-linux-x64-gnu),\nbuilt on ClickHouse (https://github.com/ClickHouse/ClickHouse); both Apache-2.0 (LICENSE).\n' \
  "$(basename "$(dirname "$CHDB_LIB")")" >"$c/licenses/chdb/NOTICE"

# Layer tarballs: every file root's, but the nonroot user's home and data
# directory (so no root is needed to build them).
tar_layer() {
  local dir=$1 out=$2
  tar --sort=name --mtime="@$EPOCH" --numeric-owner --owner=0 --group=0 \
    --exclude=./home/nonroot --exclude=./var/lib/dualflow -C "$dir" -cf "$out" .
  if [ -d "$dir/home/nonroot" ]; then
    tar --mtime="@$EPOCH" --numeric-owner --owner=$NONROOT --group=$NONROOT \
      -C "$dir" -rf "$out" ./home/nonroot ./var/lib/dualflow
  fi
}
tar_layer "$b" "$WORK/base.tar"
tar_layer "$c" "$WORK/chdb.tar"

# created: the commit's time, so that the same commit gives the same image.
# licenses: the principal licences of what the image carries, as an SPDX
# expression (dualflow's own code is LicenseRef-dualflow: the repository
# declares none yet); /licenses has every file's terms.
CREATED=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)
LICENSES="LicenseRef-dualflow AND GPL-2.0-only AND GPL-2.0-or-later AND LGPL-2.1-or-later AND Apache-2.0 AND MPL-2.0 AND BSD-3-Clause AND BSD-2-Clause AND MIT AND ISC"
labels=(--label "org.opencontainers.image.title=dualflow"
  --label "org.opencontainers.image.version=$VERSION"
  --label "org.opencontainers.image.revision=$COMMIT"
  --label "org.opencontainers.image.created=$CREATED"
  --label "org.opencontainers.image.licenses=$LICENSES"
  --label "org.opencontainers.image.source=https://github.com/dualflow/dualflow")

log "dualflow:$TAG"
ctr=$(bah from --name "dualflow-build-$$" scratch)
trap 'bah rm "$ctr" >/dev/null 2>&1 || true' EXIT
bah add --quiet "$ctr" "$WORK/base.tar" /
bah config "${labels[@]}" --user "$NONROOT:$NONROOT" --workingdir /var/lib/dualflow \
  --entrypoint '["/usr/bin/dualflow"]' --env HOME=/home/nonroot "$ctr"
bah commit --quiet --timestamp "$EPOCH" "$ctr" "localhost/dualflow:$TAG" >/dev/null
bah rm "$ctr" >/dev/null

log "dualflow-chdb:$TAG (+ libchdb)"
ctr=$(bah from --name "dualflow-chdb-build-$$" "localhost/dualflow:$TAG")
bah add --quiet "$ctr" "$WORK/chdb.tar" /
bah config --env CHDB_LIB_PATH=/usr/lib/dualflow/libchdb.so \
  --label "org.opencontainers.image.title=dualflow-chdb" "$ctr"
bah commit --quiet --timestamp "$EPOCH" "$ctr" "localhost/dualflow-chdb:$TAG" >/dev/null
bah rm "$ctr" >/dev/null
trap - EXIT
for t in "${TAGS[@]:1}"; do
  log "tagged $t too (the release tag deploy/ pins)"
  for img in dualflow dualflow-chdb; do bah tag "localhost/$img:$TAG" "localhost/$img:$t"; done
done
rm -rf "$WORK/base.tar" "$WORK/chdb.tar" "$WORK/base" "$WORK/chdb" "$WORK/base.files" "$WORK/chdb.files"

if [ "${IMAGE_ARCHIVE:-1}" = 1 ]; then
  for img in dualflow dualflow-chdb; do
    rm -f "$WORK/$img-$TAG.oci.tar"
    bah push --quiet "localhost/$img:$TAG" "oci-archive:$WORK/$img-$TAG.oci.tar:$img:$TAG"
    log "saved $WORK/$img-$TAG.oci.tar ($(du -m "$WORK/$img-$TAG.oci.tar" | cut -f1) MB)"
  done
fi
for t in "${TAGS[@]}"; do bah images --filter "reference=localhost/dualflow*:$t"; done
log "run: scripts/image.sh podman run --rm localhost/dualflow:$TAG version"
