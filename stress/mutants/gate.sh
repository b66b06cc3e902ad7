#!/usr/bin/env bash
# stress/mutants/gate.sh: proves the race suite catches every known-wrong variant of the protocols.
#
# Usage: gate.sh [SRCDIR]   (PERCH_STRESS_ROUNDS sets the rounds per race; default 200000;
#                           PERCH_GATE_ONLY=GLOB checks only the matching mutants)
# Copies SRCDIR to a scratch directory, builds the race suite once, checks
# that the real code passes, then applies each stress/mutants/*.patch in
# turn, rebuilds, and requires the suite to fail (each race stops at its
# first broken round, PERCH_STRESS_FAILFAST=1, so a caught mutant is
# cheap). Exits 1 unless every mutant is caught and the real code passes.
set -euo pipefail

src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
rounds=${PERCH_STRESS_ROUNDS:-200000}
# A mutant whose window is a couple of instructions may need more than one
# suite's worth of rounds to show: its named race may run this many times more.
named_factor=${PERCH_GATE_NAMED_FACTOR:-5}
per_run_limit=${PERCH_GATE_TIMEOUT:-900}
# PERCH_GATE_ONLY=GLOB: only the mutants whose file name matches (a quick check of new ones).
only=${PERCH_GATE_ONLY:-*}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/perch-mutants.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

copy_tree() {
	if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		# Tracked and untracked-but-not-ignored files: the tree as it is now.
		(cd "$src" && git ls-files -z --cached --others --exclude-standard) |
			(cd "$src" && xargs -0 cp --parents -t "$scratch" 2>/dev/null || true)
	else
		tar -C "$src" --exclude='./build*' --exclude=autom4te.cache -cf - . | tar -C "$scratch" -xf -
	fi
}

build_suite() {
	make -C "$scratch/b" -j"$(nproc)" stress/perch_stress >"$scratch/build.log" 2>&1
}

# Runs the suite (fail-fast when $1 is 1, only the races matching $2 when
# given) and leaves its exit status in $suite_rc and its output in run.log.
run_suite() {
	set +e
	PERCH_STRESS_ROUNDS=${suite_rounds:-$rounds} PERCH_STRESS_FAILFAST=${1:-0} \
		timeout "$per_run_limit" "$scratch/b/stress/perch_stress" ${2:+"$2"} >"$scratch/run.log" 2>&1
	suite_rc=$?
	set -e
}

# What caught a mutant: the races with a broken round (failures > 0 in the
# summary table: an overlap floor missed is not a catch), or a crash or hang.
# Prints nothing when nothing did.
what_caught() {
	[ "$suite_rc" -eq 124 ] && echo "(hung: timed out)"
	[ "$suite_rc" -gt 128 ] && echo "(crashed: signal $((suite_rc - 128)))"
	# Summary rows: name, rounds, overlaps, failures, verdict.
	sed -nE 's/^(.*[^ ]) +([0-9]+) +[0-9]+ +([1-9][0-9]*) +FAIL$/\1 (broken after \2 rounds)/p' "$scratch/run.log"
}

# The race a patch's "Caught by:" line names first: tried alone before the
# whole suite, so a caught mutant costs one race, not eight.
first_named_race() {
	sed -nE 's/^# Caught by: ([^(,]*[^ (,]).*/\1/p' "$1" | sed 's/\.$//' | head -n 1
}

copy_tree
(cd "$scratch" && { [ -x configure ] || autoreconf -fi >/dev/null 2>&1; })
mkdir -p "$scratch/b"
(cd "$scratch/b" && ../configure -q >/dev/null)
build_suite || { cat "$scratch/build.log"; echo "gate: the real code does not build"; exit 1; }

echo "mutant gate: $rounds rounds per race (a mutant's named race: up to $((rounds * named_factor)), stopping at the first broken round)"
run_suite 0
if [ "$suite_rc" -ne 0 ]; then
	echo "gate: the real code FAILS the race suite:"; cat "$scratch/run.log"; exit 1
fi
printf '%-50s %s\n' "real code" "passes"

missed=0 total=0
for patch in "$src"/stress/mutants/*.patch; do
	name=$(basename "$patch" .patch)
	# shellcheck disable=SC2254
	case $name in $only) ;; *) continue ;; esac
	total=$((total + 1))
	if ! patch -s --fuzz=0 -p1 -d "$scratch" <"$patch"; then
		printf '%-50s %s\n' "$name" "DOES NOT APPLY"; missed=$((missed + 1)); continue
	fi
	if ! build_suite; then
		printf '%-50s %s\n' "$name" "DOES NOT BUILD"; missed=$((missed + 1))
	else
		named=$(first_named_race "$patch")
		# Fail-fast, so the extra rounds cost only what a late catch needs.
		suite_rounds=$((rounds * named_factor)) run_suite 1 "$named"
		if [ "$suite_rc" -eq 2 ]; then
			echo "gate: $name: its Caught by line names no race ('$named')"; exit 1
		fi
		caught=$(what_caught)
		if [ -z "$caught" ]; then
			run_suite 1 # the named race missed it: try every race
			caught=$(what_caught)
		fi
		if [ -z "$caught" ]; then
			printf '%-50s %s\n' "$name" "MISSED"; missed=$((missed + 1))
		else
			printf '%-50s caught by: %s\n' "$name" "$(echo "$caught" | paste -sd ';' | sed 's/;/; /g')"
		fi
	fi
	patch -s --fuzz=0 -R -p1 -d "$scratch" <"$patch"
done
echo "mutants caught: $((total - missed)) of $total"
[ "$missed" -eq 0 ]
