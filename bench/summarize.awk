# bench/summarize.awk: run.sh's results table from raw.tsv: medians per (scenario, load, server), ratios, and who bounded each row.
# Variables: bound (the server's share of a core at which it counts as saturated: BOUND_UTIL, times the quota with one),
# bound_util (the client's share of its core at which it counts as saturated), contend (the share of a core that other
# work may take on the server's or the client's core before the row counts as contended; under a quota, on the server's
# core, beyond what the quota leaves idle), quota (percent, or empty).
#
# raw.tsv columns: 1 scenario, 2 load, 3 server, 4 round, 5 throughput, 6 p99 us, 7 user us/req, 8 sys us/req, 9 errors,
# 10 wall s, 11 server CPU s, 12 server CPU / wall, 13 capacity, 14 client core busy, 15 throttled share or "-",
# 16 the client's own CPU / wall, 17 other work on the server's core / wall. Older files have fewer; what is missing is "-".
BEGIN { FS = "\t" }

# The median of a space-separated list (mawk has no asort).
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}

function add(col, k, c) { if (NF >= c && $c != "-") col[k] = col[k] " " $c }
function med(col, k) { return (k in col) ? median(col[k]) : -1 }
function pct(v) { return v < 0 ? "-" : sprintf("%.0f%%", v * 100) }

$5 == "FAILED" { next }
{
	k = $1 SUBSEP $2 SUBSEP $3
	if (!(k in seen)) { seen[k] = 1; order[++n] = k; if (!(($1 SUBSEP $2) in first)) first[$1 SUBSEP $2] = $3 }
	thr[k] = thr[k] " " $5; p99[k] = p99[k] " " $6; us[k] = us[k] " " $7; sy[k] = sy[k] " " $8
	errs[k] += $9; runs[k]++
	add(ut, k, 12); add(cap, k, 13); add(cl, k, 14); add(th, k, 15); add(own, k, 16); add(oth, k, 17)
}

# Who set the pace: the server (saturated: at its core or its quota, or throttled in at least half of the quota's
# periods: its CPU over the wall reads a little low, the wall holding the client's start and connects); else other work that took the server's core or the
# client's (contended: neither server compares); else the client (its own CPU saturated, or not recorded in older files);
# else neither (both waited: latency, not CPU, bounded the row).
function bound_by(k,   u, o, c, cc) {
	u = med(ut, k); o = med(oth, k); c = med(own, k); cc = med(cl, k)
	if (u < 0) return "-"
	if (u >= bound || med(th, k) >= 0.5) return "server"
	if (o >= contend + (quota == "" ? 0 : 1 - quota / 100) || (c >= 0 && cc - c >= contend)) return "**contended**"
	if (c < 0 || c >= bound_util) return "**client**"
	return "**neither**"
}

function header() {
	print "| scenario | load | server | throughput/s (median) | p99 us | user us/req | sys us/req | ratio | capacity ratio | server CPU |" \
		(quota == "" ? "" : " throttled |") " other on server core | client CPU | client core | capacity req/CPU-s | bound by | runs | errors |"
	print "|---|---|---|---:|---:|---:|---:|---|---|---:|" (quota == "" ? "" : "---:|") "---:|---:|---:|---:|---|---:|---:|"
}

function row(k,   f, g, ref, m, r, c, rc, star, ratio, cratio, p) {
	split(k, f, SUBSEP)
	g = f[1] SUBSEP f[2]; ref = g SUBSEP first[g]
	m = median(thr[k]); r = median(thr[ref]); c = med(cap, k); rc = med(cap, ref)
	star = (bound_by(k) != "server" || bound_by(ref) != "server") ? " *" : ""
	if (f[3] == first[g]) {
		ratio = "1.00 (reference)"; cratio = "1.00 (reference)"
	} else {
		ratio = sprintf("%.2f x %s%s", (r ? m / r : 0), first[g], star)
		cratio = (c > 0 && rc > 0) ? sprintf("%.2f x %s", c / rc, first[g]) : "-"
	}
	p = median(p99[k]); p = p > 0 ? sprintf("%.1f", p) : "-" # stream loads have no round trip
	printf "| %s | %s | %s | %.0f | %s | %.2f | %.2f | %s | %s | %s |%s %s | %s | %s | %s | %s | %d | %d |\n", f[1], f[2], f[3], m,
		p, median(us[k]), median(sy[k]), ratio, cratio, pct(med(ut, k)), (quota == "" ? "" : " " pct(med(th, k)) " |"),
		pct(med(oth, k)), pct(med(own, k)), pct(med(cl, k)), (c > 0 ? sprintf("%.0f", c) : "-"), bound_by(k), runs[k], errs[k]
}

END {
	header()
	for (i = 1; i <= n; i++) row(order[i])
}
