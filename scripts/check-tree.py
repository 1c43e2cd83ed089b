#!/usr/bin/env python3
"""Checks the shape of the source tree that docs/design.md ("The code, by
role") describes, so that it stays true:

  * an include under include/memcuda/ only points down or sideways in the
    layers (never from a lower room into a higher one), and a public header
    never pulls in the registry's internals;
  * no source file under include/, src/ or tools/ is over 500 lines;
  * code and docs speak of the product, not of how it was made (no
    "issue 12", "milestone", "deliverable").

Run from anywhere: scripts/check-tree.py [repository root]. Exits 1 with one
line per finding.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
INC = ROOT / "include" / "memcuda"
MAX_LINES = 500

# Rooms, lowest first. A file may include files of its own rank or lower.
RANKS = {
    "public": 0,  # the public headers, redis/, protocol/, c/
    "base": 1,
    "cuda": 2,
    "fd": 2,
    "backend": 3,
    "pool": 4,
    "store": 4,
    "registry-shared": 5,  # SHARED below: what the roles share, and the seams they meet through
    "registry-roles": 6,  # client/, leader/, process/: each includes only its own folder and below
    "core": 7,
    "top": 8,  # ops/, control_loop.hpp
    "impl": 9,  # impl/*.ipp, implementation.hpp
}
# What a public header may reach into below it: the leaf helpers only, so
# that a user's translation unit never parses the registry's internals.
PUBLIC_MAY_INCLUDE = {"public", "base", "cuda"}
# The registry's shared layer (detail/registry/*.hpp). The roles (client/,
# leader/, process/) never include each other: they meet here, in the
# interfaces one role implements and another calls (lease_view.hpp,
# own_allocator.hpp), the messages between them (inbox.hpp) and what the
# process shares (release_queue.hpp); core.hpp is where concrete types meet.
SHARED = {"context.hpp", "liveness.hpp", "option_checks.hpp", "inbox.hpp", "release_queue.hpp", "lease_view.hpp",
          "own_allocator.hpp", "acquire_outcome.hpp"}
# The public headers detail/ below ops/ may include: value types and the
# one interface (memory_resource.hpp) the API hands down, none of which
# includes anything of the registry. The API's own classes (SharedTensor,
# TensorRegistry, ...) sit above detail/: only ops/ and impl/, which
# implement them, include those.
BASE_TYPES = {"config.hpp", "error.hpp", "dtype.hpp", "shape.hpp", "tensor_info.hpp", "stream.hpp", "options.hpp",
              "stats.hpp", "share_options.hpp", "memory_resource.hpp", "protocol.hpp"}


def room(rel: str) -> str:
    parts = rel.split("/")
    if rel == "implementation.hpp" or parts[0] == "impl":
        return "impl"
    if parts[0] != "detail":
        return "public"
    if len(parts) == 2:
        return "top"  # a loose detail header: treat it as the top, so it may not be included from below
    sub = parts[1]
    if sub == "registry":
        if len(parts) == 3:
            name = parts[2]
            if name in SHARED:
                return "registry-shared"
            if name == "core.hpp":
                return "core"
            return "top"
        return {"client": "registry-roles", "leader": "registry-roles", "process": "registry-roles",
                "ops": "top"}.get(parts[2], "top")
    if sub in RANKS:
        return sub
    return "top"


def role(rel: str) -> str:
    return rel.split("/")[2]  # detail/registry/<role>/...


def main() -> int:
    findings = []
    include_re = re.compile(r'^\s*#\s*include\s+"memcuda/([^"]+)"', re.M)
    for path in sorted(INC.rglob("*")):
        if path.suffix not in (".hpp", ".ipp", ".h"):
            continue
        rel = path.relative_to(INC).as_posix()
        mine = room(rel)
        for target in include_re.findall(path.read_text(encoding="utf-8")):
            theirs = room(target)
            if mine == "public":
                if theirs not in PUBLIC_MAY_INCLUDE:
                    findings.append(f"include/memcuda/{rel}: a public header includes {target} ({theirs})")
            elif RANKS[theirs] > RANKS[mine]:
                findings.append(f"include/memcuda/{rel} ({mine}) includes {target} ({theirs}), a higher room")
            elif rel.startswith("detail/") and mine != "top" and "/" not in target and target not in BASE_TYPES:
                findings.append(f"include/memcuda/{rel} ({mine}) includes the public {target}, not a base type")
            elif mine == theirs == "registry-roles" and role(rel) != role(target):
                findings.append(f"include/memcuda/{rel} includes {target}: roles meet only through the shared layer")
    for top in ("include", "src", "tools"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".hpp", ".ipp", ".cpp", ".h", ".c", ".cu"):
                continue
            n = sum(1 for _ in path.open(encoding="utf-8"))
            if n > MAX_LINES:
                findings.append(f"{path.relative_to(ROOT)}: {n} lines (more than {MAX_LINES})")
    process = re.compile(r"\bissues? #?\d+|\bmilestones?\b|\bdeliverables?\b", re.I)
    for top in ("include", "src", "tools", "tests", "docs", "scripts", "benchmarks", "examples", "python", "cmake"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or path.suffix not in (".hpp", ".ipp", ".cpp", ".h", ".c", ".cu", ".md", ".sh",
                                                          ".py", ".cmake", ".txt", ".in", ".toml"):
                continue
            if path.resolve() == pathlib.Path(__file__).resolve():
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if process.search(line):
                    findings.append(f"{path.relative_to(ROOT)}:{i}: speaks of how it was made: {line.strip()[:80]}")
    for f in findings:
        print(f)
    print(f"check-tree: {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
