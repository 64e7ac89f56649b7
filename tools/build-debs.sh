#!/usr/bin/env bash
# Builds the Debian packages (engramd, libengram-client0, libengram-dev, python3-engram) from a
# copy of the working tree, so the tree stays clean, and checks them with lintian.
# Usage: tools/build-debs.sh [--arch arm64] [--out DIR] [--check]
#   --arch arm64   cross-build for arm64 (needs `tools/setup.sh --arch arm64`); tests not run
#   --out DIR      where the .deb files go (default build-deb/<arch>)
#   --check        run the table and hash suites during the build (native builds only)
set -euo pipefail
cd "$(dirname "$0")/.."
arch=$(dpkg --print-architecture)
out=
check=0
while (($#)); do
  case $1 in
    --arch) arch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --check) check=1; shift ;;
    *) echo "build-debs: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
out=${out:-build-deb/$arch}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# A fixed place per architecture: the compiler flags name the source directory
# (-ffile-prefix-map), so ccache only hits when it stays the same from build to build.
work=${ENGRAM_DEB_WORKDIR:-/var/tmp/engramd-deb}/$arch
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# The tracked files and new ones git does not ignore: what a checkout of this tree would hold.
mkdir "$work/engramd"
files=$(git ls-files --cached --others --exclude-standard -z | tr '\0' '\n') ||
  { echo "build-debs: run it from an engramd git checkout" >&2; exit 1; }
# Tracked files deleted in the working tree are not copied.
while IFS= read -r f; do
  [[ -e $f || -L $f ]] && cp --parents -P -t "$work/engramd" "$f"
done <<<"$files"
cd "$work/engramd"

args=(-b -us -uc)
profiles=()
if [[ $arch != $(dpkg --print-architecture) ]]; then
  args+=("-a$arch")
  profiles+=(cross)
  check=0  # the target's binaries do not run here
fi
[[ $check == 1 ]] || profiles+=(nocheck)
args+=("-P$(IFS=,; echo "${profiles[*]}")")
echo "build-debs: dpkg-buildpackage ${args[*]} (in $work/engramd)"
options="parallel=$(nproc)"
[[ $check == 1 ]] || options+=" nocheck"
DEB_BUILD_OPTIONS="$options${DEB_BUILD_OPTIONS:+ $DEB_BUILD_OPTIONS}" \
  dpkg-buildpackage "${args[@]}" >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log"
  echo "build-debs: dpkg-buildpackage failed (log above)" >&2
  exit 1
}
cd "$work"
changes=$(ls engramd_*_"$arch".changes)
if command -v lintian >/dev/null; then
  # Errors fail the build; warnings are printed.
  lintian --fail-on error --suppress-tags-from-file /dev/null "$changes"
fi
cp ./*.deb "$out/"
echo "build-debs: $(ls ./*.deb | wc -l) packages in $out:"
ls "$out"
