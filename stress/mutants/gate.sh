#!/usr/bin/env bash
# stress/mutants/gate.sh: proves the race suite (or a named cmocka test) catches every known-wrong variant.
#
# Usage: gate.sh [SRCDIR]   (PERCH_STRESS_ROUNDS sets the rounds per race; default 200000;
#                           PERCH_GATE_ONLY=GLOB checks only the matching mutants;
#                           PERCH_GATE_SUITE_PASSED=1 skips re-running the suites, and the
#                           programs mutants name, on the real code;
#                           PERCH_GATE_LANES=N runs the test-judged mutants N at a time)
# Copies SRCDIR to a scratch directory, builds the race suite once, checks
# that the real code passes, then applies each stress/mutants/*.patch in
# turn, rebuilds, and requires the suite to fail (each race stops at its
# first broken round, PERCH_STRESS_FAILFAST=1, so a caught mutant is
# cheap). A race mutant is judged in both modes and both verdicts are
# printed: free (real parallel threads, stress/perch_stress; not judged on
# one CPU, where real threads cannot meet) and scheduled
# (stress/perch_stress_sched, the controlled scheduler; its seed replays a
# catch). Each mode that judges must catch it, unless the patch says why
# that mode cannot: "# Not in free mode: WHY" or "# Not in scheduled mode:
# WHY". A patch whose header says "# Caught by test: PROGRAM [TEST]"
# (e.g. tests/test_epoll a_yielded_...) is judged by that cmocka program
# instead: it must pass on the real code and fail with the patch (TEST,
# when given, runs first on its own through PERCH_TEST_FILTER; then the
# whole program); "# Caught by asan test: PROGRAM [TEST]" is the same in
# an ASan+UBSan build, for a use after free the plain build runs through
# (or a broken invariant: PERCH_ASSERT is on in sanitizer builds only).
# The test-judged mutants run first, in parallel lanes (each its own copy
# of the tree: they mostly wait on sockets and timers); the race mutants
# after them, one at a time, with the CPUs to themselves.
# Exits 1 unless every mutant is caught and the real code passes.
set -euo pipefail

src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
rounds=${PERCH_STRESS_ROUNDS:-200000}
# A mutant whose window is a couple of instructions may need more than one
# suite's worth of rounds to show: its named race may run this many times more.
named_factor=${PERCH_GATE_NAMED_FACTOR:-5}
per_run_limit=${PERCH_GATE_TIMEOUT:-900}
# PERCH_GATE_ONLY=GLOB: only the mutants whose file name matches (a quick check of new ones).
only=${PERCH_GATE_ONLY:-*}
test_limit=${PERCH_GATE_TEST_TIMEOUT:-120}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/perch-mutants.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

copy_tree() {
	if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		# Tracked and untracked-but-not-ignored files: the tree as it is now.
		(cd "$src" && git ls-files -z --cached --others --exclude-standard) |
			(cd "$src" && xargs -0 cp --parents -t "$scratch" 2>/dev/null || true)
	else
		# A release tarball or an archive: everything but the build trees
		# (a directory with a config.status), keeping build-aux/.
		local excludes=() d
		for d in "$src"/*/; do
			[ -f "$d/config.status" ] && excludes+=(--exclude="./$(basename "$d")")
		done
		tar -C "$src" "${excludes[@]}" --exclude=./autom4te.cache -cf - . | tar -C "$scratch" -xf -
	fi
}

build_suite() {
	make -C "$scratch/b" -j"$jobs" stress/perch_stress stress/perch_stress_sched >"$scratch/build.log" 2>&1
}

# The binary of a mode: free or sched.
suite_binary() {
	if [ "$1" = sched ]; then echo "$scratch/b/stress/perch_stress_sched"; else echo "$scratch/b/stress/perch_stress"; fi
}

# Runs the suite in mode $1 (free or sched), fail-fast when $2 is 1, only
# the races matching $3 when given; leaves its exit status in $suite_rc and
# its output in run.log.
run_suite() {
	set +e
	PERCH_STRESS_ROUNDS=${suite_rounds:-$rounds} PERCH_STRESS_FAILFAST=${2:-0} \
		timeout "$per_run_limit" "$(suite_binary "$1")" ${3:+"$3"} >"$scratch/run.log" 2>&1
	suite_rc=$?
	set -e
}

# Real threads meet only with two CPUs or more.
cpus=$(nproc)
jobs=${JOBS:-$cpus}

# What caught a mutant: the races with a broken round (failures > 0 in the
# summary table: an overlap floor missed is not a catch), or a crash or hang.
# Prints nothing when nothing did.
what_caught() {
	[ "$suite_rc" -eq 124 ] && echo "(hung: timed out)"
	[ "$suite_rc" -gt 128 ] && echo "(crashed: signal $((suite_rc - 128)))"
	# Summary rows: name, rounds, overlaps, failures, verdict.
	# The rounds column counts the rounds run: the broken one is the last.
	sed -nE 's/^(.*[^ ]) +([0-9]+) +[0-9]+ +([1-9][0-9]*) +FAIL$/\1 \2/p' "$scratch/run.log" |
		awk '{ n = $NF; $NF = ""; sub(/ $/, ""); printf "%s (broken in round %d)\n", $0, n - 1 }'
}

# A scheduled catch's replay command, as the harness printed it.
replay_line() {
	sed -nE 's/^ *replay: (.*)/\1/p' "$scratch/run.log" | head -n 1
}

# The race a patch's "Caught by:" line names first: tried alone before the
# whole suite, so a caught mutant costs one race, not eight.
first_named_race() {
	sed -nE 's/^# Caught by: ([^(,]*[^ (,]).*/\1/p' "$1" | sed 's/\.$//' | head -n 1
}

# Why a patch says mode $2 (free or scheduled) cannot catch it (the line
# and the comment lines that continue it), or nothing.
not_in_mode() {
	awk -v tag="# Not in $2 mode: " '
		index($0, tag) == 1 { why = substr($0, length(tag) + 1); on = 1; next }
		on && /^# [^A-Z]/ { why = why " " substr($0, 3); next }
		{ on = 0 }
		END { if (why != "") print why }' "$1"
}

# A patch's "Caught by test:" line: "PROGRAM [TEST]", or nothing.
named_test() {
	sed -nE 's/^# Caught by test: ([^ ]+)( +([^ ]+))? *$/\1 \3/p' "$1" | head -n 1
}

# A patch's "Caught by asan test:" line: the same, judged in an ASan+UBSan
# build (a use after free that the plain build runs through unharmed).
named_asan_test() {
	sed -nE 's/^# Caught by asan test: ([^ ]+)( +([^ ]+))? *$/\1 \3/p' "$1" | head -n 1
}

# The ASan+UBSan build directory, configured the first time a mutant needs it.
asan_build() {
	if [ ! -f "$scratch/b-asan/Makefile" ]; then
		mkdir -p "$scratch/b-asan"
		(cd "$scratch/b-asan" && ../configure -q --enable-sanitizers=address,undefined >/dev/null)
	fi
	echo "$scratch/b-asan"
}

# Builds and runs cmocka program $1 (only the tests matching $2, unless
# empty) in build directory $3 (default: the plain build); leaves its exit
# status in $test_rc and its output in run.log; test_built is 0 when it
# did not build (no exit status is set aside for that: a cmocka program
# whose test crashed in its teardown exits 255). With $4 = 1 a table that
# failed on io_uring is not run again on epoll (PERCH_TEST_FAILFAST:
# tests/both_backends.h), for a verdict any failure gives.
run_test() {
	local dir=${3:-$scratch/b}
	set +e
	if ! make -C "$dir" -j"$jobs" "$1" >"$scratch/build.log" 2>&1; then
		test_built=0 test_rc=1
	else
		test_built=1
		PERCH_TEST_FILTER=${2:-} PERCH_TEST_FAILFAST=${4:-0} timeout "$test_limit" "$dir/$1" >"$scratch/run.log" 2>&1
		test_rc=$?
	fi
	set -e
}

# The first error line of the last build, or its last line.
build_error() {
	grep -m1 -E ': (fatal )?error:|Killed|No space|Error [0-9]' "$scratch/build.log" || tail -n 1 "$scratch/build.log"
}

# What the failing cmocka run said: its failed tests and first error line.
test_failure() {
	[ "$test_rc" -eq 124 ] && echo "(hung: timed out)"
	[ "$test_rc" -gt 128 ] && [ "$test_rc" -ne 255 ] && echo "(crashed: signal $((test_rc - 128)))"
	[ "$test_rc" -eq 255 ] && echo "(cmocka could not run a test: a crash, or a failed setup or teardown)"
	sed -nE 's/^\[  FAILED  \] ([a-z_0-9]+)$/\1/p' "$scratch/run.log" | sort -u |
		awk 'NR <= 3; END { if (NR > 3) print "(+" NR - 3 " more failed)" }'
	grep -m1 -E '^\[  (ERROR|FAILED) +\] ---' "$scratch/run.log" | sed 's/^\[ *[A-Z]* *\] --- //'
	grep -m1 -E '^\[   LINE   \] ---' "$scratch/run.log" | sed 's/^.*--- .*\/tests\//tests\//'
	grep -m1 -oE '(AddressSanitizer|UndefinedBehaviorSanitizer): [A-Za-z-]+( on address)?|perch: invariant broken: .*' "$scratch/run.log"
}

# "; skipped: TEST ..." when the last run skipped tests (a skip on this
# machine, a low fd limit say, is a common reason a mutant goes unseen).
tests_skipped() {
	local skipped
	skipped=$(sed -nE 's/^\[  SKIPPED \] ([a-z_0-9]+)$/\1/p' "$scratch/run.log" | sort -u | paste -sd ' ')
	[ -z "$skipped" ] || echo "; skipped: $skipped"
}

# A mutant judged by a cmocka program built in DIR: "judge_by_test NAME DIR
# SANITIZER PROGRAM [TEST]"; with SANITIZER 1 only a sanitizer's report,
# or perch's own "invariant broken" line, counts as a catch (a test's
# assertion or a timeout in the slower build does not). Prints its
# verdict line; returns 1 when missed.
judge_by_test() {
	local name=$1 dir=$2 sanitizer=$3 program=$4 filter=${5:-} how failfast=1
	[ "$sanitizer" = 1 ] && failfast=0 # the report may come only on the second backend
	run_test "$program" "$filter" "$dir" "$failfast"
	if [ "$test_built" -eq 0 ]; then
		printf '%-50s %s: %s\n' "$name" "DOES NOT BUILD" "$(build_error)"; return 1
	fi
	if [ "$test_rc" -eq 0 ] && [ -n "$filter" ]; then
		run_test "$program" "" "$dir" "$failfast" # the named test missed it: try the whole program
	fi
	if [ "$test_rc" -eq 0 ]; then
		printf '%-50s %s\n' "$name" "MISSED ($program passes$(tests_skipped))"; return 1
	fi
	if [ "$sanitizer" = 1 ] && ! grep -qE '(Address|UndefinedBehavior|Leak)Sanitizer|perch: invariant broken' "$scratch/run.log"; then
		printf '%-50s %s\n' "$name" "MISSED ($program failed without a sanitizer report)"; return 1
	fi
	how=$(test_failure | paste -sd ';' | sed 's/;/; /g')
	printf '%-50s caught by: %s: %s\n' "$name" "$program" "$how"
}

# Mode $1's verdict on the patch $2: "caught by: ...", "MISSED", or "not
# judged: ..."; returns 1 when missed.
race_verdict() {
	local mode=$1 patch=$2 named caught why
	why=$(not_in_mode "$patch" "$([ "$mode" = sched ] && echo scheduled || echo free)")
	if [ -n "$why" ]; then echo "not judged: $why"; return 0; fi
	if [ "$mode" = free ] && [ "$cpus" -lt 2 ]; then echo "not judged: one CPU"; return 0; fi
	named=$(first_named_race "$patch")
	# Fail-fast, so the extra rounds cost only what a late catch needs.
	suite_rounds=$((rounds * named_factor)) run_suite "$mode" 1 "$named"
	if [ "$suite_rc" -eq 2 ]; then
		echo "its Caught by line names no race ('$named')"; return 1
	fi
	scheduler_error && return 1
	caught=$(what_caught)
	if [ -z "$caught" ]; then
		run_suite "$mode" 1 # the named race missed it: try every race
		scheduler_error && return 1
		caught=$(what_caught)
	fi
	if [ -z "$caught" ]; then echo "MISSED"; return 1; fi
	echo "caught by: $(echo "$caught" | paste -sd ';' | sed 's/;/; /g')$([ "$mode" = sched ] &&
		echo "; replay: $(replay_line)")"
}

# Exit status 3: the scheduler could not run a race (a replay diverged, a
# round too long): an error, never a catch. Prints it and returns 0 then.
scheduler_error() {
	[ "$suite_rc" -eq 3 ] || return 1
	echo "ERROR: $(grep -m1 'SCHEDULER ERROR' "$scratch/run.log" | sed 's/^ *//')"
}

# A race mutant, judged in both modes: prints both verdicts; returns 1
# when a mode that judges missed it, or when no mode could judge it.
judge_by_races() {
	local name=$1 patch=$2 free sched rc=0
	free=$(race_verdict free "$patch") || rc=1
	sched=$(race_verdict sched "$patch") || rc=1
	case "$free/$sched" in "not judged"*/"not judged"*)
		sched="$sched; NOT JUDGED in any mode here"; rc=1 ;;
	esac
	race_mutants=$((race_mutants + 1))
	case $free in "caught by:"*) free_caught=$((free_caught + 1)) ;; esac
	case $sched in "caught by:"*) sched_caught=$((sched_caught + 1)) ;; esac
	printf '%-50s free:      %s\n%-50s scheduled: %s\n' "$name" "$free" "" "$sched"
	return "$rc"
}

copy_tree
(cd "$scratch" && { [ -x configure ] || autoreconf -fi >/dev/null 2>&1; })
mkdir -p "$scratch/b"
(cd "$scratch/b" && ../configure -q >/dev/null)
build_suite || { cat "$scratch/build.log"; echo "gate: the real code does not build"; exit 1; }

echo "mutant gate: $rounds rounds per race (a mutant's named race: up to $((rounds * named_factor)), stopping at the first broken round)"
# ./dev test runs the same suite on the same tree just before the gate, and
# stops if it fails; it says so with PERCH_GATE_SUITE_PASSED=1 to save a run.
if [ "${PERCH_GATE_SUITE_PASSED:-0}" = 1 ]; then
	printf '%-50s %s\n' "real code" "passed the race suites in the steps before"
else
	for mode in free sched; do
		[ "$mode" = free ] && [ "$cpus" -lt 2 ] && continue
		run_suite "$mode" 0
		if [ "$suite_rc" -ne 0 ]; then
			echo "gate: the real code FAILS the $mode race suite:"; cat "$scratch/run.log"; exit 1
		fi
	done
fi
[ "$cpus" -lt 2 ] && echo "gate: one CPU: free-mode verdicts are not judged here (real threads cannot meet)"
# Every program a mutant names must pass on the real code, or its failure
# proves nothing. ./dev test ran every one of them (make check, plain and
# under ASan) on this tree in the steps before the gate: with
# PERCH_GATE_SUITE_PASSED=1 they are not run again here.
if [ "${PERCH_GATE_SUITE_PASSED:-0}" = 1 ]; then
	printf '%-50s %s\n' "real code" "passed the programs mutants name in the steps before"
else
	for program in $(for patch in "$src"/stress/mutants/*.patch; do
		# shellcheck disable=SC2254
		case $(basename "$patch" .patch) in $only) named_test "$patch" ;; esac
	done | awk '{print $1}' | sort -u); do
		run_test "$program"
		if [ "$test_rc" -ne 0 ]; then
			echo "gate: the real code FAILS $program:"; cat "$scratch/build.log" "$scratch/run.log"; exit 1
		fi
		tests_named="${tests_named:-} $program"
	done
	for program in $(for patch in "$src"/stress/mutants/*.patch; do
		# shellcheck disable=SC2254
		case $(basename "$patch" .patch) in $only) named_asan_test "$patch" ;; esac
	done | awk '{print $1}' | sort -u); do
		run_test "$program" "" "$(asan_build)"
		if [ "$test_rc" -ne 0 ]; then
			echo "gate: the real code FAILS $program under ASan:"; cat "$scratch/build.log" "$scratch/run.log"; exit 1
		fi
		tests_named="${tests_named:-} $program (asan)"
	done
fi
[ -n "${tests_named:-}" ] && printf '%-50s %s\n' "real code" "passes the programs mutants name:$tests_named"

# Applies patch $1 to the tree at $scratch, judges it, and takes it back
# out. Prints its verdict; returns 1 when missed.
judge_one() {
	local patch=$1 name by_test by_asan_test rc=0
	name=$(basename "$patch" .patch)
	# A dry run first: a patch that half-applies would leave its good hunks in the tree for the next mutant.
	if ! patch -s --fuzz=0 --dry-run -p1 -d "$scratch" <"$patch" >/dev/null 2>&1 ||
	   ! patch -s --fuzz=0 -p1 -d "$scratch" <"$patch"; then
		printf '%-50s %s\n' "$name" "DOES NOT APPLY"; return 1
	fi
	by_test=$(named_test "$patch")
	by_asan_test=$(named_asan_test "$patch")
	if [ -n "$by_test" ]; then
		# shellcheck disable=SC2086 # "PROGRAM [TEST]": two words
		judge_by_test "$name" "$scratch/b" 0 $by_test || rc=1
	elif [ -n "$by_asan_test" ]; then
		# shellcheck disable=SC2086
		judge_by_test "$name" "$(asan_build)" 1 $by_asan_test || rc=1
	elif ! build_suite; then
		printf '%-50s %s: %s\n' "$name" "DOES NOT BUILD" "$(build_error)"; rc=1
	else
		judge_by_races "$name" "$patch" || rc=1
	fi
	patch -s --fuzz=0 -R -p1 -d "$scratch" <"$patch"
	return "$rc"
}

# Lane $1: judges the mutants named in lane_names[$1], in a copy of the
# source of its own (from lanes/src.tar), writing each verdict to
# lanes/verdicts/NAME and a mark to lanes/missed/NAME for each miss.
run_lane() {
	local n=$1 name root=$scratch/lanes
	scratch=$root/$n
	mkdir -p "$scratch/b"
	tar -C "$scratch" -xf "$root/src.tar"
	(cd "$scratch/b" && ../configure -q >/dev/null)
	for name in ${lane_names[n]:-}; do
		local start=$SECONDS
		judge_one "$src/stress/mutants/$name.patch" >"$root/verdicts/$name" || : >"$root/missed/$name"
		echo "$((SECONDS - start)) $name" >>"$root/seconds"
	done
}

# Mutants judged by cmocka programs mostly wait on sockets and timers:
# they run in parallel lanes, each in its own tree. Race mutants need the
# CPUs to themselves and run one at a time after them.
test_patches=() race_patches=()
for patch in "$src"/stress/mutants/*.patch; do
	# shellcheck disable=SC2254
	case $(basename "$patch" .patch) in $only) ;; *) continue ;; esac
	if [ -n "$(named_test "$patch")$(named_asan_test "$patch")" ]; then
		test_patches+=("$patch")
	else
		race_patches+=("$patch")
	fi
done
lanes=${PERCH_GATE_LANES:-$((cpus + 1 < 4 ? cpus + 1 : 4))}
# The ASan-judged ones share lane 0, so only one lane makes an ASan build
# (each counted as ASAN_COST plain ones); each other one goes to the lane
# with the least work so far.
ASAN_COST=4
lane_names=() lane_load=()
for ((n = 0; n < lanes; n++)); do lane_load[n]=0; done
for patch in ${test_patches[@]+"${test_patches[@]}"}; do
	if [ -n "$(named_asan_test "$patch")" ]; then
		n=0 cost=$ASAN_COST
	else
		n=0 cost=1
		for ((k = 1; k < lanes; k++)); do
			[ "${lane_load[k]}" -lt "${lane_load[n]}" ] && n=$k
		done
	fi
	lane_load[n]=$((lane_load[n] + cost))
	lane_names[n]="${lane_names[n]:-} $(basename "$patch" .patch)"
done
mkdir -p "$scratch/lanes/verdicts" "$scratch/lanes/missed"
: >"$scratch/lanes/seconds"
# The source as it is (no build trees), read once, before any lane writes.
tar -C "$scratch" --exclude=./b --exclude=./b-asan --exclude=./lanes --exclude=./run.log \
	--exclude=./build.log -cf "$scratch/lanes/src.tar" .
echo "mutant gate: ${#test_patches[@]} mutants judged by cmocka programs, in $lanes parallel lanes"
for ((n = 0; n < lanes; n++)); do
	run_lane "$n" &
done
wait
missed=0 total=0 race_mutants=0 free_caught=0 sched_caught=0 missed_names=""
for patch in ${test_patches[@]+"${test_patches[@]}"}; do
	name=$(basename "$patch" .patch)
	total=$((total + 1))
	if [ -f "$scratch/lanes/verdicts/$name" ]; then
		cat "$scratch/lanes/verdicts/$name"
	else
		printf '%-50s %s\n' "$name" "NOT JUDGED (its lane failed)" | tee "$scratch/lanes/verdicts/$name"
		: >"$scratch/lanes/missed/$name"
	fi
	if [ -f "$scratch/lanes/missed/$name" ]; then
		missed=$((missed + 1)) missed_names="$missed_names $name"
	fi
done
for patch in ${race_patches[@]+"${race_patches[@]}"}; do
	total=$((total + 1))
	name=$(basename "$patch" .patch)
	start=$SECONDS
	judge_one "$patch" >"$scratch/lanes/verdicts/$name" || {
		missed=$((missed + 1)) missed_names="$missed_names $name"
	}
	echo "$((SECONDS - start)) $name" >>"$scratch/lanes/seconds"
	cat "$scratch/lanes/verdicts/$name"
done
# Where the gate's time went: the slowest mutants (a hang caught only by a timeout shows here).
echo "mutant gate: the slowest mutants (seconds to build and judge):"
sort -rn "$scratch/lanes/seconds" | awk 'NR <= 8 { printf "  %4d s  %s\n", $1, $2 }'
# The misses again, next to the count, so a log cut in the middle still shows them.
for name in $missed_names; do
	printf 'missed: '; cat "$scratch/lanes/verdicts/$name"
done
echo "mutants caught: $((total - missed)) of $total ($race_mutants by races: free caught $free_caught," \
	"scheduled caught $sched_caught, the rest not judged in that mode; $((total - race_mutants)) by cmocka tests)"
[ "$missed" -eq 0 ]
