#!/usr/bin/env python3
# doc/man/from-headers.py: writes the section-3 pages from the public headers' own comments.
#
# One page per header (perch_conn.3 for <perch/conn.h>, ...) holds every
# call, type and constant it declares, each with the comment above it (the
# contract: what it returns, on which thread, which errors); each call also
# gets a one-line page (".so man3/perch_conn.3") so that `man perch_conn_read`
# finds it. pages.am lists them all for automake. tests/man_pages.sh runs
# this into a scratch directory and fails when the committed pages differ,
# so a header's contract and its page cannot drift apart.
#
# Usage: doc/man/from-headers.py INCLUDE_DIR OUT_DIR
import os
import re
import sys

HEADERS = ["vtask", "conn", "loop", "sock", "pipe", "segs", "timer", "server", "tls"]


def roff_text(line):
    """One line of prose, escaped for roff."""
    line = line.replace("\\", "\\e")
    if line.startswith((".", "'")):
        line = "\\&" + line
    return line


def roff_code(line):
    """One line of a declaration, inside .EX/.EE."""
    line = line.replace("\\", "\\e").replace("\t", "        ")
    if line.startswith((".", "'")):
        line = "\\&" + line
    return line


def comment_text(block):
    """The prose of a /* ... */ block: its lines, without the stars."""
    body = block.strip()
    assert body.startswith("/*") and body.endswith("*/"), body
    body = body[2:-2]
    lines = []
    for raw in body.split("\n"):
        s = raw.strip()
        if s.startswith("*"):
            s = s[1:]
            if s.startswith(" "):
                s = s[1:]
        lines.append(s.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def items(text):
    """The header's top-level items in order: ('comment', text), ('pp', line) and ('decl', text)."""
    text = re.sub(r'^(extern "C" \{|\})$', "", text, flags=re.M)  # C++'s linkage block
    out = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.index("*/", i) + 2
            out.append(("comment", text[i:j]))
            i = j
            continue
        if text[i] in " \t\n":
            i += 1
            continue
        if text[i] == "#":
            j = text.find("\n", i)
            j = n if j < 0 else j
            line = text[i:j]
            while line.endswith("\\"):
                k = text.find("\n", j + 1)
                k = n if k < 0 else k
                line = text[i:k]
                j = k
            out.append(("pp", line))
            i = j
            continue
        # A declaration: up to the ';' at brace depth 0 (a trailing comment stays with it).
        depth, j = 0, i
        while j < n:
            if text.startswith("/*", j):
                j = text.index("*/", j) + 2
                continue
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif c == ";" and depth == 0:
                break
            j += 1
        out.append(("decl", text[i:j + 1]))
        i = j + 1
    return out


def decl_name(decl):
    """(kind, name) of a declaration: ('fn', 'perch_x'), ('type', 'struct perch_x'), or None."""
    flat = " ".join(re.sub(r"/\*.*?\*/", "", decl, flags=re.S).split())
    if flat.startswith("PERCH_API"):
        m = re.search(r"(\w+)\s*\(", flat)
        return ("fn", m.group(1))
    if flat.startswith("typedef"):
        m = re.search(r"\(\s*\*\s*(\w+)\s*\)", flat) or re.search(r"(\w+)\s*;$", flat)
        return ("type", m.group(1))
    m = re.match(r"(struct|enum|union)\s+(\w+)\s*\{", flat)
    if m:
        return ("type", m.group(1) + " " + m.group(2))
    return None  # a forward declaration ("struct perch_loop;"), and the like


def page(header, text):
    """The roff page of one header, and the names of its calls."""
    first = comment_text(re.match(r"\s*(/\*.*?\*/)", text, re.S).group(1))
    summary = " ".join(first).split(":", 1)[1].strip().rstrip(".")
    calls, entries, pending = [], [], []
    for kind, body in items(text)[1:]:
        if kind == "comment":
            pending.append(comment_text(body))
            continue
        if kind == "pp":
            m = re.match(r"#define\s+(PERCH_\w+)", body)
            if m and not m.group(1).endswith("_H") and m.group(1) not in ("PERCH_API",):
                if pending[:-1]:  # free-standing prose before the constant's own comment
                    entries.append(("prose", None, None, pending[:-1]))
                entries.append(("const", m.group(1), body, pending[-1:]))
            elif pending:
                entries.append(("prose", None, None, pending))
            pending = []
            continue
        what = decl_name(body)
        if what is None:
            if pending:
                entries.append(("prose", None, None, pending))
            pending = []
            continue
        if pending[:-1]:
            entries.append(("prose", None, None, pending[:-1]))
        entries.append((what[0], what[1], body, pending[-1:]))
        if what[0] == "fn":
            calls.append(what[1])
        pending = []
    name = "perch_" + header
    lines = [
        '.\\" Written by doc/man/from-headers.py from include/perch/%s.h: edit the header, then run it.' % header,
        '.TH %s 3 "" "perch" "perch manual"' % name.upper(),
        ".nh",
        ".ad l",
        ".SH NAME",
        roff_text(", ".join(calls)) + " \\- " + roff_text(summary),
        ".SH SYNOPSIS",
        ".nf",
        ".B #include <perch/%s.h>" % header,
        ".fi",
        ".PP",
        "Compile and link with",
        ".IR \"pkg-config \\-\\-cflags \\-\\-static \\-\\-libs perch\"",
        "(perch is a static library: its dependencies' libraries are named only with",
        ".BR \\-\\-static ).",
        ".SH DESCRIPTION",
    ]
    section = "DESCRIPTION"
    for kind, ident, body, prose in entries:
        if kind == "prose":
            for block in prose:
                title = re.match(r"-{2,}\s*(.*?)\s*-{2,}$", block[0]) if block else None
                if title:
                    lines.append(".SS " + roff_text(title.group(1)))
                    block = block[1:]
                lines += paragraphs(block)
            continue
        if kind == "fn":
            lines.append(".SS " + ident + "()")
        elif kind == "type":
            lines.append(".SS " + ident)
        else:
            lines.append(".SS " + ident)
        lines.append(".PP")
        lines.append(".EX")
        code = re.sub(r"^PERCH_API ", "", body.strip())  # the export attribute, not the user's business
        lines += [roff_code(l) for l in code.split("\n")]
        lines.append(".EE")
        for block in prose:
            lines += paragraphs(block)
    lines += [
        ".SH SEE ALSO",
        ", ".join("\\fBperch_%s\\fP(3)" % h for h in HEADERS if h != header)
        + "; doc/*.md in the perch source tree.",
    ]
    return "\n".join(lines) + "\n", calls


def paragraphs(block):
    out, para = [], []
    for l in block + [""]:
        if l:
            para.append(roff_text(l))
        elif para:
            out.append(".PP")
            out += para
            para = []
    return out


def main():
    inc, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    listed = []
    for h in HEADERS:
        with open(os.path.join(inc, "perch", h + ".h")) as f:
            text = f.read()
        roff, calls = page(h, text)
        with open(os.path.join(out, "perch_%s.3" % h), "w") as f:
            f.write(roff)
        listed.append("perch_%s.3" % h)
        for c in calls:
            with open(os.path.join(out, c + ".3"), "w") as f:
                f.write(".so man3/perch_%s.3\n" % h)
            listed.append(c + ".3")
    with open(os.path.join(out, "pages.am"), "w") as f:
        f.write("## Written by doc/man/from-headers.py: the section-3 pages, one per header and a link per call.\n")
        f.write("PERCH_MAN_PAGES = \\\n")
        f.write(" \\\n".join("\tdoc/man/" + p for p in listed) + "\n")


if __name__ == "__main__":
    main()
