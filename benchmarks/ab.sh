#!/usr/bin/env bash
# A / B of a generator change in one device call: runs COMMAND twice, first on a copy of this
# checkout whose templates/ (and targets/, grammar/, attngen/ where given) come from BASE, then on the
# checkout itself, each with a cache of its own, so that a probe's numbers for the old and the new
# source come from the same machine and the same run (benchmarks/NOTES.md compares them).
#   git archive <rev> templates targets grammar | (mkdir -p ab-base && tar -x -C ab-base)   # here
#   (add attngen to the list where the change is in the planner or the emitter too)
#   bash benchmarks/ab.sh ab-base python3 benchmarks/probes/probe_persistent.py --dims 64 --no-flex
# (ab-base/ travels with the working tree to the GPU machine when it is not ignored; delete it
# after.) Each run's output is prefixed with "== base" or "== head". The command runs from the
# root of its copy, with PYTHONPATH pointing there.
set -uo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: ab.sh BASE_DIR COMMAND...}; shift
[ $# -gt 0 ] || { echo "ab.sh: no command to run" >&2; exit 2; }
[ -d "$base/templates" ] || { echo "ab.sh: $base has no templates/ folder" >&2; exit 2; }
root=$(pwd)
copy=$(mktemp -d "${TMPDIR:-/tmp}/attngen-ab.XXXXXX")
trap 'rm -rf "$copy"' EXIT
cp -r attngen grammar templates targets benchmarks examples "$copy"/
for kind in templates targets grammar attngen; do
    if [ -d "$base/$kind" ]; then rm -rf "${copy:?}/$kind"; cp -r "$base/$kind" "$copy/$kind"; fi
done
rc=0
for side in base head; do
    dir=$copy; [ $side = head ] && dir=$root
    echo "== $side"
    (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" \
        ATTNGEN_CACHE_DIR="${ATTNGEN_CACHE_DIR:-/tmp/attngen-cache}-ab-$side" "$@") || rc=$?
done
exit $rc
