# bench/quota.sh: sourced by run.sh: a cgroup with a CPU bandwidth quota (v1 cpu.cfs_quota_us or v2 cpu.max) that every server runs in.
# Both the server's group and the client's (no quota) have the highest CPU weight, so other work on their cores yields to them.
# quota_setup fills QUOTA_DIR (the cgroup), QUOTA_PROCS (the file a pid is written to), CLIENT_DIR and CLIENT_PROCS
# (the client's group), QUOTA_KIND (v1 or v2), QUOTA_HOW
# (one line for the report); start_server (servers.sh) writes each server's pid to QUOTA_PROCS before its exec and checks
# it with quota_holds; quota_teardown removes the cgroup.

QUOTA_DIR="" QUOTA_PROCS="" QUOTA_KIND="" QUOTA_HOW="" QUOTA_V2_ENABLED="" CLIENT_DIR="" CLIENT_PROCS=""

quota_fail() {
	echo "run.sh: server quota: $*; not running unthrottled (leave -q out to run without a quota)" >&2
	exit 1
}

# The mount point of the cgroup v1 hierarchy that has the cpu controller, if writable.
quota_v1_mount() {
	local m
	m=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ { print $2; exit }' /proc/mounts)
	[[ -n $m && -w $m/cpu.cfs_quota_us ]] && echo "$m"
}

# The mount point of the cgroup v2 hierarchy, if the cpu controller is bound to it.
quota_v2_mount() {
	local m
	m=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
	[[ -n $m && -r $m/cgroup.controllers ]] && grep -qw cpu "$m/cgroup.controllers" && echo "$m"
}

# A new cgroup DIR with the highest weight, so that work outside the benchmark on the same core yields to it.
quota_group() { # dir weight-file weight
	mkdir "$1" || quota_fail "cannot create $1"
	echo "$3" >"$1/$2" || quota_fail "cannot write $2=$3 in $1"
}

# v1: the groups under the cpu hierarchy's root; the server's with cpu.cfs_period_us and cpu.cfs_quota_us.
quota_setup_v1() { # mount quota_us period_us
	QUOTA_KIND=v1 QUOTA_DIR=$1/perch-bench.$$ CLIENT_DIR=$1/perch-bench-client.$$
	quota_group "$QUOTA_DIR" cpu.shares 262144
	quota_group "$CLIENT_DIR" cpu.shares 262144
	# The period first: a quota longer than the old period is refused by some kernels otherwise.
	{ echo "$3" >"$QUOTA_DIR/cpu.cfs_period_us" && echo "$2" >"$QUOTA_DIR/cpu.cfs_quota_us"; } ||
		quota_fail "cannot write cpu.cfs_period_us=$3 / cpu.cfs_quota_us=$2 in $QUOTA_DIR"
	[[ ! -e $QUOTA_DIR/cpu.cfs_burst_us ]] || echo 0 >"$QUOTA_DIR/cpu.cfs_burst_us" ||
		quota_fail "cannot set cpu.cfs_burst_us to 0 in $QUOTA_DIR"
	QUOTA_HOW="cgroup v1 $QUOTA_DIR: cpu.cfs_quota_us=$2, cpu.cfs_period_us=$3, no burst, cpu.shares=262144;"
	QUOTA_HOW+=" the client in $CLIENT_DIR: cpu.shares=262144, no quota"
}

# v2: the groups under the root (the root itself may hold processes), cpu enabled for its children; the server's cpu.max.
quota_setup_v2() { # mount quota_us period_us
	QUOTA_KIND=v2
	if ! grep -qw cpu "$1/cgroup.subtree_control"; then
		echo +cpu >"$1/cgroup.subtree_control" || quota_fail "cannot enable the cpu controller in $1/cgroup.subtree_control"
		QUOTA_V2_ENABLED=$1
	fi
	QUOTA_DIR=$1/perch-bench.$$ CLIENT_DIR=$1/perch-bench-client.$$
	quota_group "$QUOTA_DIR" cpu.weight 10000
	quota_group "$CLIENT_DIR" cpu.weight 10000
	echo "$2 $3" >"$QUOTA_DIR/cpu.max" || quota_fail "cannot write cpu.max='$2 $3' in $QUOTA_DIR"
	[[ ! -e $QUOTA_DIR/cpu.max.burst ]] || echo 0 >"$QUOTA_DIR/cpu.max.burst" ||
		quota_fail "cannot set cpu.max.burst to 0 in $QUOTA_DIR"
	QUOTA_HOW="cgroup v2 $QUOTA_DIR: cpu.max=\"$2 $3\", no burst, cpu.weight=10000; the client in $CLIENT_DIR: cpu.weight=10000, no quota"
}

# quota_setup PERCENT PERIOD_US [auto|v1|v2]: the cgroup every server will run in, PERCENT% of one CPU.
quota_setup() {
	local pct=$1 period=$2 want=${3:-auto} quota m
	[[ $pct =~ ^[1-9][0-9]*$ ]] && ((pct <= 100)) || quota_fail "the quota is a whole percentage of one CPU, 1 to 100 (got '$pct')"
	[[ $period =~ ^[1-9][0-9]*$ ]] && ((period >= 1000 && period <= 1000000)) ||
		quota_fail "the period is 1000 to 1000000 us (got '$period')"
	quota=$((period * pct / 100))
	((quota >= 1000)) || quota_fail "$pct% of a ${period} us period is under the kernel's 1000 us minimum quota: lengthen QUOTA_PERIOD_US"
	[[ $want =~ ^(auto|v1|v2)$ ]] || quota_fail "QUOTA_CGROUP is auto, v1 or v2 (got '$want')"
	if [[ $want != v2 ]] && m=$(quota_v1_mount); then
		quota_setup_v1 "$m" "$quota" "$period"
	elif [[ $want != v1 ]] && m=$(quota_v2_mount); then
		quota_setup_v2 "$m" "$quota" "$period"
	else
		quota_fail "no writable cgroup cpu controller ($want): neither a v1 cpu hierarchy with cpu.cfs_quota_us nor a v2 one with cpu in cgroup.controllers (run as root?)"
	fi
	QUOTA_PROCS=$QUOTA_DIR/cgroup.procs CLIENT_PROCS=$CLIENT_DIR/cgroup.procs
}

# True when every pid given is in the quota's cgroup (or there is no quota).
quota_holds() { # pid...
	local pid rel=${QUOTA_DIR#"$(dirname "$QUOTA_DIR")"}
	[[ -n $QUOTA_DIR ]] || return 0
	for pid in "$@"; do
		if [[ $QUOTA_KIND == v1 ]]; then
			grep -Eq "^[0-9]+:([^:]*,)?cpu(,[^:]*)?:$rel\$" "/proc/$pid/cgroup" || return 1
		else
			grep -qx "0::$rel" "/proc/$pid/cgroup" || return 1
		fi
	done
}

# Periods and throttled periods so far, e.g. "1200 530" ("0 0" without a quota).
quota_periods() {
	[[ -n $QUOTA_DIR ]] || { echo "0 0"; return; }
	awk '$1 == "nr_periods" { p = $2 } $1 == "nr_throttled" { t = $2 } END { print p + 0, t + 0 }' "$QUOTA_DIR/cpu.stat"
}

# Removes a cgroup made here (its processes have ended by then; a straggler goes back to the parent first).
quota_remove() { # dir
	local pid
	[[ -n $1 && -d $1 ]] || return 0
	while read -r pid; do
		echo "$pid" >"$(dirname "$1")/cgroup.procs" 2>/dev/null || true
	done <"$1/cgroup.procs"
	rmdir "$1" 2>/dev/null || echo "run.sh: could not remove the cgroup $1" >&2
}

# Removes both groups, and gives back the cpu controller of the v2 root if it was enabled here.
quota_teardown() {
	quota_remove "$QUOTA_DIR"
	quota_remove "$CLIENT_DIR"
	[[ -z $QUOTA_V2_ENABLED ]] || echo -cpu >"$QUOTA_V2_ENABLED/cgroup.subtree_control" 2>/dev/null || true
	QUOTA_DIR="" QUOTA_PROCS="" CLIENT_DIR="" CLIENT_PROCS="" QUOTA_V2_ENABLED=""
}
