#!/usr/bin/env python3
"""Checks that docs/operations.md, "Environment", lists exactly the MEMCUDA_*
variables mem-cuda reads at run time: the library (include/), the C ABI and
compiled library (src/), the memcuda tool (tools/) and the Python package
(python/memcuda/). A variable is read where its name is a string literal
(getenv("MEMCUDA_X"), env_value("MEMCUDA_X"), os.environ.get("MEMCUDA_X"), a
constant naming it). Exit 0 when the table and the sources agree; else 1,
naming each variable read but not listed, or listed but never read.

    scripts/check-env.py [REPO_ROOT]"""
from __future__ import annotations

import os
import re
import sys

SOURCES = ("include", "src", "tools", os.path.join("python", "memcuda"))
SUFFIXES = (".hpp", ".h", ".ipp", ".cpp", ".c", ".py")
READ = re.compile(r"""["'](MEMCUDA_[A-Z0-9_]+)""")
ROW = re.compile(r"^\| `(MEMCUDA_[A-Z0-9_]+)` \|")


def reads(root: str) -> dict:
    """{variable: first file that reads it}."""
    found: dict = {}
    for top in SOURCES:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SUFFIXES):
                    continue
                path = os.path.join(d, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for name in READ.findall(fh.read()):
                        found.setdefault(name, os.path.relpath(path, root))
    return found


def table(root: str) -> set:
    """The variables of the table under "### Environment" in docs/operations.md."""
    names = set()
    inside = False
    with open(os.path.join(root, "docs", "operations.md"), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#"):
                inside = line.strip() == "### Environment"
                continue
            m = ROW.match(line) if inside else None
            if m:
                names.add(m.group(1))
    return names


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    read, listed = reads(root), table(root)
    if not listed:
        print("docs/operations.md: no variable table under '### Environment'")
        return 1
    bad = [f"{v}: read in {read[v]} but not in docs/operations.md, \"Environment\"" for v in sorted(set(read) - listed)]
    bad += [f"{v}: listed in docs/operations.md, \"Environment\", but read nowhere" for v in sorted(listed - set(read))]
    for line in bad:
        print(line)
    print(f"{len(read)} variables read, {len(listed)} listed, {len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
