#!/usr/bin/env bash
# interleave.sh runs one package's Go benchmarks at two revisions in turn,
# round after round, and sums up each metric's range per revision.
#
# This machine's speed moves by up to a third within an hour, so two
# revisions are compared only by runs taken in turn; this is how the
# performance log's "in turn" and "interleaved" comparisons are made.
#
#   scripts/interleave.sh [-n rounds] REV_A REV_B PACKAGE [go test flags...]
#
# e.g. scripts/interleave.sh -n 3 HEAD~1 HEAD ./internal/kvdir \
#        -bench 'KeyTableChurn' -benchtime 20000x
#
# PACKAGE is a directory of the module (./internal/kvdir). Each
# revision's test binary is built once, in a worktree of its own (removed
# at the end), and run from the package's directory at that revision, as
# `go test` would. The go test flags -bench, -benchtime, -run (default
# '^$'), -count, -cpu and -benchmem are passed on. Every run's benchmark
# lines go to stdout under a header naming its round, side and time; a
# summary follows: for each benchmark and unit, min–max per revision and
# B's value over A's in each round (which side is ahead depends on the
# unit: ns/op falls, blocks/s rises).
set -euo pipefail

rounds=3
while getopts "n:" opt; do
  case $opt in
    n) rounds=$OPTARG ;;
    *) echo "usage: $0 [-n rounds] REV_A REV_B PACKAGE [flags...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 3 ]; then
  echo "usage: $0 [-n rounds] REV_A REV_B PACKAGE [flags...]" >&2
  exit 2
fi
case $rounds in
  '' | *[!0-9]* | 0) echo "$0: -n must be a positive integer, not '$rounds'" >&2; exit 2 ;;
esac
revA=$1 revB=$2 pkg=$3
shift 3

# Test binary flags: each go test flag gains the test. prefix.
args=(-test.run '^$')
while [ $# -gt 0 ]; do
  case $1 in
    -bench | -benchtime | -run | -count | -cpu)
      [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
      args+=("-test.${1#-}" "$2"); shift 2 ;;
    -bench=* | -benchtime=* | -run=* | -count=* | -cpu=*)
      args+=("-test.${1#-}"); shift ;;
    -benchmem) args+=(-test.benchmem); shift ;;
    *) echo "$0: flag $1 is not one this script passes on" >&2; exit 2 ;;
  esac
done

root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
cleanup() {
  for w in "$work"/a "$work"/b; do
    [ -d "$w" ] && git -C "$root" worktree remove --force "$w" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

build() { # rev dir
  local commit
  commit=$(git -C "$root" rev-parse --verify --quiet "$1^{commit}") || { echo "$0: no revision $1" >&2; exit 2; }
  git -C "$root" worktree add --quiet --detach "$2" "$commit"
  (cd "$2" && go test -c -o "$2.test" "$pkg")
}
build "$revA" "$work/a"
build "$revB" "$work/b"

raw=$work/raw
: >"$raw"
for r in $(seq 1 "$rounds"); do
  for side in a b; do
    rev=$revA
    [ $side = b ] && rev=$revB
    echo "== round $r $side ($rev) $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$work/$side/$pkg" && "$work/$side.test" "${args[@]}") | grep '^Benchmark' | sed "s/^/$side $r /" | tee -a "$raw"
  done
done

# Summary: for every benchmark and unit, min–max over the rounds per
# side, then B/A round by round (a benchmark run -count times in a round
# counts its last run there).
echo "== summary over $rounds rounds: A = $revA, B = $revB"
awk -v rounds="$rounds" '
{
  side = $1; round = $2; name = $3
  for (i = 5; i < NF; i += 2) {
    key = name " " $(i + 1)
    v = $i + 0
    k = key SUBSEP side
    if (!(k in lo) || v < lo[k]) lo[k] = v
    if (!(k in hi) || v > hi[k]) hi[k] = v
    val[key, side, round] = v
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
  }
}
END {
  for (j = 1; j <= n; j++) {
    key = order[j]
    a = key SUBSEP "a"; b = key SUBSEP "b"
    ratios = ""
    for (r = 1; r <= rounds; r++) {
      if ((key, "a", r) in val && (key, "b", r) in val && val[key, "a", r] != 0) {
        ratios = ratios sprintf(" %.3f", val[key, "b", r] / val[key, "a", r])
      } else {
        ratios = ratios " -"
      }
    }
    printf "%s: A %s–%s, B %s–%s; B/A by round:%s\n", key, (a in lo ? lo[a] : "-"), (a in hi ? hi[a] : "-"), (b in lo ? lo[b] : "-"), (b in hi ? hi[b] : "-"), ratios
  }
}' "$raw"
