#!/usr/bin/env python3
"""bench/callgrind_atomics.py: the atomic read-modify-writes a callgrind profile counted in one binary, by function.

Usage: bench/callgrind_atomics.py PROFILE BINARY

PROFILE is a callgrind output made with --dump-instr=yes; BINARY the program
(or library) it ran, whose functions are counted. Prints "FILE:FUNCTION COUNT"
lines, as bench/https_instr.sh's by_function does: how many times each
function executed a lock-prefixed instruction or an xchg with memory (x86's
read-modify-writes: each a full barrier, 2.4 to 2.6 ns back to back on
this machine against 0.5 for a plain add, which an instruction count
weighs as one).
"""
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


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    profile, binary = sys.argv[1:]
    with open(profile, errors="replace") as f:
        if not any(line.startswith("positions: instr") for line in f):
            sys.exit(f"callgrind_atomics.py: {profile} has no instruction addresses (callgrind --dump-instr=yes)")
    for where, n in sorted(counts(profile, binary, atomic_addresses(binary)).items()):
        print(where, n)


if __name__ == "__main__":
    main()
