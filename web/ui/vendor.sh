#!/usr/bin/env bash
# vendor.sh re-fetches the UI's vendored npm packages at the exact versions
# pinned in static/vendor/VERSIONS and checks their sha256 (verify), or
# rewrites VERSIONS from what it fetched (update). The UI stays offline:
# the files are embedded in the binary, never loaded from a CDN.
#
#   web/ui/vendor.sh verify   # fetch, compare with the committed files
#   web/ui/vendor.sh update   # fetch and overwrite the committed files
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$here/static/vendor
mode=${1:-verify}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# package version file-in-package vendored-name
files=(
	"cytoscape 3.35.0 dist/cytoscape.min.js cytoscape.min.js"
	"cytoscape 3.35.0 LICENSE cytoscape.LICENSE"
	"layout-base 2.0.1 layout-base.js layout-base.js"
	"layout-base 2.0.1 LICENSE layout-base.LICENSE"
	"cose-base 2.2.0 cose-base.js cose-base.js"
	"cose-base 2.2.0 LICENSE cose-base.LICENSE"
	"cytoscape-fcose 2.2.0 cytoscape-fcose.js cytoscape-fcose.js"
	"cytoscape-fcose 2.2.0 LICENSE cytoscape-fcose.LICENSE"
	"uplot 1.6.32 dist/uPlot.iife.min.js uPlot.iife.min.js"
	"uplot 1.6.32 dist/uPlot.min.css uPlot.min.css"
	"uplot 1.6.32 LICENSE uPlot.LICENSE"
	"d3-array 2.12.1 dist/d3-array.min.js d3-array.min.js"
	"d3-array 2.12.1 LICENSE d3-array.LICENSE"
	"d3-path 1.0.9 dist/d3-path.min.js d3-path.min.js"
	"d3-path 1.0.9 LICENSE d3-path.LICENSE"
	"d3-shape 1.3.7 dist/d3-shape.min.js d3-shape.min.js"
	"d3-shape 1.3.7 LICENSE d3-shape.LICENSE"
	"d3-sankey 0.12.3 dist/d3-sankey.min.js d3-sankey.min.js"
	"d3-sankey 0.12.3 LICENSE d3-sankey.LICENSE"
)
fail=0
out=$tmp/VERSIONS
echo "# name version file sha256 (web/ui/vendor.sh verify re-fetches and checks)" >"$out"
for f in "${files[@]}"; do
	read -r pkg ver src name <<<"$f"
	if [ ! -d "$tmp/$pkg" ]; then
		(cd "$tmp" && npm pack --silent "$pkg@$ver" >/dev/null)
		mkdir -p "$tmp/$pkg" && tar xzf "$tmp/$pkg-$ver.tgz" -C "$tmp/$pkg"
	fi
	sum=$(sha256sum "$tmp/$pkg/package/$src" | cut -d' ' -f1)
	echo "$pkg $ver $name $sum" >>"$out"
	case $mode in
	update) cp "$tmp/$pkg/package/$src" "$dir/$name" ;;
	verify)
		have=$(sha256sum "$dir/$name" | cut -d' ' -f1)
		if [ "$have" != "$sum" ]; then
			echo "vendor: $name differs from $pkg@$ver/$src" >&2
			fail=1
		fi
		;;
	*) echo "usage: $0 verify|update" >&2; exit 2 ;;
	esac
done
if [ "$mode" = update ]; then
	cp "$out" "$dir/VERSIONS"
elif ! diff -u "$dir/VERSIONS" "$out"; then
	echo "vendor: VERSIONS differs from the fetched packages" >&2
	fail=1
fi
[ $fail = 0 ] && echo "vendor: $mode ok"
exit $fail
