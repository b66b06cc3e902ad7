#!/usr/bin/env bash
# tests/man_pages.sh: every public call has a section-3 page, the pages say what the headers say, and each renders without a warning.
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
fail=0
bad() {
	echo "FAIL: $*"
	fail=1
}

# 1. A page (or a link to its header's page) for every PERCH_API declaration.
calls=$(sed -n 's/^PERCH_API [^(]*[ *]\(perch_[a-z0-9_]*\)(.*/\1/p' "$top"/include/perch/*.h | sort -u)
[[ -n $calls ]] || bad "no PERCH_API declaration found in $top/include/perch"
for call in $calls; do
	page=$top/doc/man/$call.3
	if [[ ! -f $page ]]; then
		bad "$call has no page ($page): run doc/man/from-headers.py include doc/man"
		continue
	fi
	target=$(sed -n 's|^\.so man3/\(.*\)$|\1|p' "$page")
	[[ -n $target ]] || target=$call.3
	grep -q "^\\.SS $call()$" "$top/doc/man/$target" || bad "$target does not describe $call"
done

# 2. The pages are the headers' comments as they are now: a changed contract changes its page.
if command -v python3 >/dev/null; then
	out=$(mktemp -d "${TMPDIR:-/tmp}/perch-man.XXXXXX")
	trap 'rm -rf "$out"' EXIT
	python3 "$top/doc/man/from-headers.py" "$top/include" "$out" || bad "from-headers.py failed"
	for f in "$out"/*; do
		cmp -s "$f" "$top/doc/man/$(basename "$f")" ||
			bad "doc/man/$(basename "$f") differs from its header: run doc/man/from-headers.py include doc/man"
	done
	for f in "$top"/doc/man/*.3; do
		[[ -f $out/$(basename "$f") ]] || bad "doc/man/$(basename "$f") documents nothing the headers declare"
	done
else
	echo "note: no python3, the pages were not compared with the headers"
fi

# 3. Each header's page renders without a warning (the links are one .so line each).
if command -v man >/dev/null; then
	for page in "$top"/doc/man/perch_*.3; do
		grep -q '^\.so ' "$page" && continue
		warnings=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
		[[ -z $warnings ]] || bad "$(basename "$page") renders with warnings: $warnings"
	done
else
	echo "note: man is not installed (./dev deps installs man-db), the pages were not rendered"
fi

((fail == 0)) && echo "PASS: $(wc -w <<<"$calls") calls, each with its page"
exit "$fail"
