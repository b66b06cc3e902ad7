#!/usr/bin/env bash
# check.sh - exhaustively check every spin model in this folder.
#
# For each *.pml here: spin -a, gcc -DSAFETY pan.c, ./pan, in a temporary
# directory (nothing is written into the repository).  pan exits 0 even when it
# finds an error, so the verdict comes from its output ("errors: N").
#
#   - a model whose name contains "_broken" is a mutant: it passes only when
#     pan finds an error (the model catches the break);
#   - any other model passes only with "errors: 0", a complete search, and, if
#     its file says "@all-reached", no unreached state except assert(false).
#
# Prints one line per model (name, states stored, verdict); exits 1 if any model
# fails, 2 if spin or a C compiler is missing.
# Usage: bash doc/model/check.sh [model.pml ...]   (from any directory)

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SPIN=${SPIN:-spin}
CC=${CC:-gcc}
DEPTH=${PAN_DEPTH:-100000}          # -m: DFS depth limit; the models reach < 200
# The largest state space (read_slot, ~1 million states) takes pan ~2 s even
# unoptimised, the others well under a second, while gcc -O2 on pan.c costs
# ~3 s per model.
PAN_CFLAGS=${PAN_CFLAGS:--O0}

for tool in "$SPIN" "$CC"; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "check.sh: '$tool' not found (apt-get install spin gcc)" >&2
		exit 2
	fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/perch-model.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT

if [ $# -gt 0 ]; then
	models=("$@")
else
	models=("$here"/*.pml)
fi

# Check one model in its own directory; writes "<states>\t<verdict>\t<ok|FAIL>"
# to $dir/verdict.  Runs in the background, one per model.
check_one() {
	local src=$1 dir=$2
	local file name out errors states first unreached
	file=$(basename "$src")
	name=${file%.pml}
	mkdir -p "$dir"
	cp "$here"/*.pml "$dir"/            # mutants #include their base model
	cp "$src" "$dir"/ 2>/dev/null
	(
		cd "$dir" || exit 1
		if ! "$SPIN" -a "$file" >spin.log 2>&1; then
			printf -- '-\tspin -a failed: %s\tFAIL\n' "$(grep -m1 -i error spin.log)" >verdict
			exit 0
		fi
		if ! "$CC" $PAN_CFLAGS -DSAFETY -w -o pan pan.c >cc.log 2>&1; then
			printf -- '-\tgcc pan.c failed: %s\tFAIL\n' "$(head -n1 cc.log)" >verdict
			exit 0
		fi
		./pan -m"$DEPTH" -w20 >pan.out 2>&1

		errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.out | head -n1)
		states=$(sed -n 's/^ *\([0-9][0-9.e+]*\) states, stored.*/\1/p' pan.out | head -n1)
		: "${states:=-}"
		if [ -z "$errors" ]; then
			printf '%s\tpan gave no verdict\tFAIL\n' "$states" >verdict
			exit 0
		fi

		case $name in
		*_broken*)
			if [ "$errors" -gt 0 ]; then
				first=$(grep -m1 '^pan:[0-9]*:' pan.out | sed 's/^pan:[0-9]*: *//; s/ (at depth [0-9]*)//')
				printf '%s\tcaught: %s\tok\n' "$states" "$first" >verdict
			else
				printf '%s\tNOT CAUGHT (errors: 0)\tFAIL\n' "$states" >verdict
			fi
			;;
		*)
			if [ "$errors" -ne 0 ]; then
				first=$(grep -m1 '^pan:[0-9]*:' pan.out | sed 's/^pan:[0-9]*: *//')
				printf '%s\tERRORS: %s: %s (trail below)\tFAIL\n' \
					"$states" "$errors" "$first" >verdict
				# a correct model failed: replay the counterexample for the report
				"$SPIN" -t -p -g "$file" 2>&1 | grep -v '^[[:space:]]*$' >trail.txt
			elif grep -q 'Search not completed\|max search depth too small' pan.out; then
				printf '%s\tsearch incomplete (raise PAN_DEPTH)\tFAIL\n' "$states" >verdict
			elif grep -q '@all-reached' "$file"; then
				# unreached lines look like: "	file.pml:12, state 3, \"stmt\""
				unreached=$(awk '/^unreached in /{u=1; next} u && /^\t[^(]/' pan.out |
					grep -v -e '"assert(0)"' -e '"-end-"' | head -n1 | sed 's/^[[:space:]]*/ /')
				if [ -n "$unreached" ]; then
					printf '%s\tunreached state:%s\tFAIL\n' "$states" "$unreached" >verdict
				else
					printf '%s\tok: 0 errors, every step reached\tok\n' "$states" >verdict
				fi
			else
				printf '%s\tok: 0 errors\tok\n' "$states" >verdict
			fi
			;;
		esac
	)
}

i=0
for m in "${models[@]}"; do
	check_one "$m" "$work/$i" &
	i=$((i + 1))
done
wait

fail=0
printf '%-42s %9s  %s\n' model states verdict
i=0
for m in "${models[@]}"; do
	name=$(basename "$m" .pml)
	if [ -f "$work/$i/verdict" ]; then
		IFS=$'\t' read -r states verdict status <"$work/$i/verdict"
	else
		states=- verdict="no verdict" status=FAIL
	fi
	[ "$status" = ok ] || { fail=1; verdict="FAIL - $verdict"; }
	printf '%-42s %9s  %s\n' "$name" "$states" "$verdict"
	i=$((i + 1))
done

i=0
for m in "${models[@]}"; do
	if [ -s "$work/$i/trail.txt" ]; then
		echo
		echo "== counterexample for $(basename "$m") (spin -t -p -g) =="
		cat "$work/$i/trail.txt"
	fi
	i=$((i + 1))
done

if [ "$fail" -ne 0 ]; then
	echo "check.sh: FAILED" >&2
	exit 1
fi
echo "check.sh: all models pass (correct models clean, every mutant caught)"
