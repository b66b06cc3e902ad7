#!/usr/bin/env python3
"""bench/callgrind_atomics.py: the atomic read-modify-writes a callgrind profile counted in one binary, by function.

Usage: bench/callgrind_atomics.py PROFILE BINARY
       bench/callgrind_atomics.py --per N PROFILE_A PROFILE_B BINARY

PROFILE is a callgrind output made with --dump-instr=yes; BINARY the program
(or library) it ran, whose functions are counted. The first form prints
"FILE:FUNCTION COUNT" lines: how many times each function executed a
lock-prefixed instruction or an xchg with memory (x86's read-modify-writes:
each a full barrier, 2.4 to 2.6 ns back to back on this machine against 0.5
for a plain add, which an instruction count weighs as one). The second
prints perch's (functions under lib/ or pipes/, ck_pr.h's inlined, or named
perch_*) over the N units of work PROFILE_B did more than PROFILE_A, and the
functions that made the most (TOP, 8).
"""
import os
import re
import subprocess
import sys
from collections import Counter


def atomic_addresses(binary):
    """The addresses of BINARY's lock-prefixed instructions and xchgs with memory."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary],
                         capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m and (m.group(2) == "lock" or (m.group(2) == "xchg" and "(" in m.group(3))):
            found.add(int(m.group(1), 16))
    return found


def counts(profile, binary, atomics):
    """Executions of the atomic addresses in the object named like BINARY, by "file:function"."""
    name = binary.rsplit("/", 1)[-1]
    names = {}          # (kind, id) -> name, for ob, fl and fn (cfn, cob, fi, fe share them)
    ob = fl = fn = None
    addr = 0
    skip = False        # the cost line after calls= is the call's, not an instruction's
    per = Counter()
    for line in open(profile, errors="replace"):
        m = re.match(r"(c?)(ob|fl|fi|fe|fn)=\((\d+)\)(?: (.*))?", line)
        if m:
            called, kind, ident, given = m.groups()
            kind = {"fi": "fl", "fe": "fl"}.get(kind, kind)
            if given:
                names[(kind, ident)] = given.strip()
            if not called and kind == "ob":
                ob = names.get((kind, ident), "")
            elif not called and kind == "fn":
                fn = names.get((kind, ident), "?")
            elif not called and m.group(2) == "fl":
                fl = names.get((kind, ident), "???")
            continue
        if line.startswith("calls="):
            skip = True
            continue
        m = re.match(r"(0x[0-9a-f]+|[+-]\d+|\*)(?:\s+\S+)?(?:\s+(\d+))?\s*$", line)
        if not m:
            continue
        pos = m.group(1)
        if pos.startswith("0x"):
            addr = int(pos, 16)
        elif pos[0] in "+-":
            addr += int(pos)
        if skip:
            skip = False
            continue
        if m.group(2) and ob and ob.rsplit("/", 1)[-1] == name and addr in atomics:
            per[f"{fl}:{fn}"] += int(m.group(2))
    return per


def is_perch(where):
    """Whether a "file:function" is perch's own, as bench/https_instr.sh buckets instructions."""
    file, _, fn = where.rpartition(":")
    return (re.search(r"(^|/)(lib|pipes)/[^/]+$", file) is not None or file.endswith("ck_pr.h")
            or fn.startswith("perch_"))


def per_unit(n, profile_a, profile_b, binary):
    """perch's atomics over the n extra units of profile_b, and the functions making the most."""
    atomics = atomic_addresses(binary)
    a, b = counts(profile_a, binary, atomics), counts(profile_b, binary, atomics)
    by = Counter()
    for where in b:
        if is_perch(where):
            by[where.rpartition(":")[2].split("'")[0]] += b[where] - a.get(where, 0)
    total = sum(by.values())
    top = int(os.environ.get("TOP", "8"))
    most = " ".join(f"{fn} {d / n:.1f}" for fn, d in by.most_common(top) if d > 0)
    print(f"perch: {total / n:.1f}; the most: {most}")


def has_addresses(profile):
    with open(profile, errors="replace") as f:
        return any(line.startswith("positions: instr") for line in f)


def main():
    args = sys.argv[1:]
    if len(args) == 5 and args[0] == "--per" and args[1].isdigit() and int(args[1]) > 0:
        profiles, binary = args[2:4], args[4]
    elif len(args) == 2:
        profiles, binary = args[:1], args[1]
    else:
        sys.exit(__doc__.split("\n\n")[1])
    for profile in profiles:
        if not has_addresses(profile):
            sys.exit(f"callgrind_atomics.py: {profile} has no instruction addresses (callgrind --dump-instr=yes)")
    if len(profiles) == 2:
        per_unit(int(args[1]), profiles[0], profiles[1], binary)
        return
    for where, n in sorted(counts(profiles[0], binary, atomic_addresses(binary)).items()):
        print(where, n)


if __name__ == "__main__":
    main()
