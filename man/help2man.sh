#!/usr/bin/env bash
# Writes a man page with help2man from a built program's --help, for man/meson.build.
# Usage: help2man.sh OUT NAME SECTION VERSION SUMMARY EXE [RUNNER...] -- [help2man options...]
#   RUNNER: a command that runs EXE (a cross build's emulator); none natively.
# The program is run as NAME (CLI11 prints argv[0] in its usage line), and engramd with an
# empty configuration file in place of its default one, whose values its --help would otherwise
# show as the defaults; the page names $ENGRAM_DEFAULT_CONFIG (the build's
# SYSCONFDIR/engramd/engramd.toml, what engramd reads without --config) again.
set -euo pipefail

out=$1 name=$2 section=$3 version=$4 summary=$5 exe=$6
shift 6
runner=()
while (($#)) && [[ $1 != -- ]]; do
  runner+=("$1")
  shift
done
(($#)) && shift

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
config_args=()
if [[ $name == engramd ]]; then
  : >"$work/engramd.toml"
  config_args=(--config "$work/engramd.toml")
fi
# The wrapper help2man runs: prints the program's output with its path replaced by NAME, and
# with two spaces between an option and its description where CLI11 left one (an option 28
# columns wide), which help2man needs to tell them apart.
{
  printf '#!/usr/bin/env bash\n'
  printf 'out=$('
  printf '%q ' "${runner[@]}" "$exe"
  printf '"$@" '
  printf '%q ' "${config_args[@]}"
  printf '2>&1); rc=$?\n'
  printf 'out=${out//%q/%q}\n' "$exe" "$name"
  printf 'printf "%%s\\n" "$out" | sed -E %q; exit $rc\n' 's/^(  -.{25}[^ ]) ([^ ])/\1  \2/'
} >"$work/bin/$name"
chmod +x "$work/bin/$name"

help2man --no-info --no-discard-stderr --section="$section" --version-string="$version" \
  --name="$summary" "$@" --output="$work/page" "$work/bin/$name"
# Paths of the build machine must not reach the page.
default_config=${ENGRAM_DEFAULT_CONFIG:-/etc/engramd/engramd.toml}
sed -e "s|$work/engramd.toml|$default_config|g" -e "s|$work/bin/||g" "$work/page" >"$out"
if grep -q "$work" "$out"; then
  echo "help2man.sh: $out still names the build's temporary folder $work" >&2
  exit 1
fi
