#!/usr/bin/env python3
"""Checks the shape of the source tree that docs/design.md ("The code, by
role") describes, so that it stays true:

  * an include under include/memcuda/ only points down or sideways in the
    layers (never from a lower room into a higher one), and a public header
    never pulls in the registry's internals;
  * the registry's job folders include each other only down JOBS (lease/
    below create/ below gc/ below takeover/), and get/ and those never
    include each other: they meet through the interfaces of the shared
    layer;
  * detail/ below ops/ includes no public header but the base types;
  * no source file under include/, src/, tools/ or python/ is over 500
    lines, and no function in them over 80 (C++ by a brace-matching scan of
    function bodies, Python by its syntax tree), but for the named
    exceptions below, each with its reason;
  * only detail/store/ (and redis/, which defines it) runs a Lua script
    (`.eval(`): each script's KEYS and ARGV are built in one typed call;
  * code and docs speak of the product, not of how it was made (no
    "issue 12", "milestone", "deliverable").

Run from anywhere: scripts/check-tree.py [repository root]. Exits 1 with one
line per finding.
"""
import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
INC = ROOT / "include" / "memcuda"
MAX_LINES = 500
MAX_FUNCTION_LINES = 80
# Files allowed over MAX_LINES, each with its reason: "path": "why".
LONG_FILES = {
}
# Functions allowed over MAX_FUNCTION_LINES, each with its reason:
# "path:Class::name": "why".
LONG_FUNCTIONS = {
}

# Rooms, lowest first. A file may include files of its own rank or lower.
RANKS = {
    "public": 0,  # the public headers, redis/, protocol/, c/
    "base": 1,
    "process": 1,  # detail/process/: the process object, its parts only named (defined in impl/)
    "cuda": 2,
    "fd": 2,
    "transfer": 2,  # detail/transfer/: the byte mover between nodes, nothing of Redis
    "backend": 3,
    "pool": 4,
    "store": 4,
    "registry-shared": 5,  # SHARED below: what the jobs share, and the seams they meet through
    "registry-jobs": 6,  # get/ and the leader's jobs in JOBS: among themselves, see JOBS
    "core": 7,
    "top": 8,  # ops/, control_loop.hpp
    "impl": 9,  # impl/*.ipp, implementation.hpp
}
# What a public header may reach into below it: the leaf helpers only, so
# that a user's translation unit never parses the registry's internals.
# transfer: <memcuda/fleet.hpp> links a byte mover into the program that
# includes it (its engine's header installs the mover factory).
PUBLIC_MAY_INCLUDE = {"public", "base", "cuda", "transfer"}
# The registry's shared layer (detail/registry/*.hpp). The process asking
# (get/) and the allocator of record's jobs never include each other: they
# meet here, in the interfaces one side implements and the other calls
# (lease_view.hpp, own_allocator.hpp), the messages between them (inbox.hpp),
# what the process shares (release_queue.hpp) and the index repair every job
# of the leader runs; core.hpp is where concrete types meet.
SHARED = {"context.hpp", "liveness.hpp", "option_checks.hpp", "inbox.hpp", "release_queue.hpp", "lease_view.hpp",
          "own_allocator.hpp", "acquire_outcome.hpp", "index_repair.hpp"}
# The allocator of record's job folders, lowest first: one includes its own
# and lower ones only (an Allocator holds the Lease, GC frees through the
# Allocator, a takeover scans orphans and frees through GC).
JOBS = {"lease": 0, "create": 1, "gc": 2, "takeover": 3, "fleet": 4}
# The process asking (get/: Client, Holdings, Invalidation, Recovery) stands
# apart from JOBS: neither includes the other.
APART = {"get"}
# The public headers detail/ below ops/ may include: value types and the
# one interface (memory_resource.hpp) the API hands down, none of which
# includes anything of the registry. The API's own classes (SharedTensor,
# TensorRegistry, ...) sit above detail/: only ops/ and impl/, which
# implement them, include those.
BASE_TYPES = {"config.hpp", "error.hpp", "dtype.hpp", "shape.hpp", "tensor_info.hpp", "stream.hpp", "options.hpp",
              "stats.hpp", "share_options.hpp", "memory_resource.hpp", "protocol.hpp"}
# Where scripts are run (redis::Script::eval): the store's typed calls.
SCRIPT_ROOMS = ("include/memcuda/detail/store/", "include/memcuda/redis/")
EVAL_RE = re.compile(r"\.eval\s*\(")

SOURCE_SUFFIXES = (".hpp", ".ipp", ".cpp", ".h", ".c", ".cu")


def blank_out(text: str) -> str:
    """The text with comments, string and character literals (raw strings
    too: the Lua scripts) and preprocessor lines replaced by spaces, line
    breaks kept, so that braces and lines can be counted."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":  # a directive, with its continuations
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and not (text[i - 1].isalnum() or text[i - 1] == "_"):
            d = text[i + 2:text.find("(", i + 2)]
            j = text.find(")" + d + '"', i)
            j = n if j < 0 else j + len(d) + 2
        elif c in "\"'" and not (c == "'" and text[i - 1].isalnum()):  # 1'000: a digit separator
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


SCOPE_RE = re.compile(r"\b(namespace|class|struct|union|enum)\b|\bextern\s*$")
NAME_RE = re.compile(r"(~?[A-Za-z_]\w*(?:\s*::\s*~?[A-Za-z_]\w*)*|operator\s*[^\s(]+)\s*\($")


def cpp_functions(text: str):
    """(name, first line, line count) of every function defined at namespace
    or class scope: the declaration's first line to its closing brace.
    Lambdas and local classes count as part of their function."""
    s = blank_out(text)
    scopes = []  # names of the classes/namespaces we are in ("" for a namespace)
    decl_start = 0
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in ";":
            decl_start = i + 1
        elif c == "}":
            if scopes:
                scopes.pop()
            decl_start = i + 1
        elif c == "{":
            decl = s[decl_start:i]
            head = decl.split("(", 1)[0]
            m = SCOPE_RE.search(head)
            if m and "=" not in head:
                words = re.findall(r"[A-Za-z_]\w*", head[m.end():])
                words = [w for w in words if w not in ("final", "public", "private", "protected", "virtual", "class")]
                scopes.append(words[0] if words and m.group(1) in ("class", "struct", "union") else "")
                decl_start = i + 1
                i += 1
                continue
            end = match_brace(s, i)
            # A body only where the declaration has a parameter list and is
            # not an initialiser (`= {`, `x{...}` at namespace scope).
            body = "(" in decl and not re.search(r"=\s*$", decl) and re.search(r"[)\]>}\w]\s*$", decl) \
                and not re.search(r"(?<![=!<>])=(?![=])", decl.split("(", 1)[0])
            if body:
                name_part = decl[: paren_start(decl)]
                nm = NAME_RE.search(name_part + "(")
                name = re.sub(r"\s+", "", nm.group(1)) if nm else "?"
                cls = [x for x in scopes if x]
                if cls and "::" not in name:
                    name = "::".join(cls) + "::" + name
                first = s.count("\n", 0, decl_start + len(decl) - len(decl.lstrip())) + 1
                last = s.count("\n", 0, end) + 1
                yield name, first, last - first + 1
            i = end + 1
            decl_start = i
            continue
        i += 1


def paren_start(decl: str) -> int:
    """Where the parameter list begins: the first '(' outside template
    brackets that is not operator()'s own."""
    depth = 0
    for k, ch in enumerate(decl):
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0:
            if decl[:k].rstrip().endswith("operator") and decl[k + 1:k + 2] == ")":
                return k + 2 + decl[k + 2:].index("(")
            return k
    return len(decl)


def match_brace(s: str, i: int) -> int:
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def python_functions(text: str):
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


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
        return "registry-jobs" if parts[2] in JOBS or parts[2] in APART else "top"  # ops/: the top
    if sub in RANKS:
        return sub
    return "top"


def job(rel: str) -> str:
    return rel.split("/")[2]  # detail/registry/<job>/...


def job_finding(rel: str, target: str):
    """Why an include between two job folders breaks their order, or None."""
    mine, theirs = job(rel), job(target)
    if mine == theirs:
        return None
    if mine in APART or theirs in APART:
        return f"include/memcuda/{rel} includes {target}: get/ and the leader's jobs meet only through the shared layer"
    if JOBS[theirs] > JOBS[mine]:
        return f"include/memcuda/{rel} includes {target}: {theirs}/ is above {mine}/ in JOBS"
    return None


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
            elif mine == theirs == "registry-jobs" and job_finding(rel, target):
                findings.append(job_finding(rel, target))
    long_seen = set()
    for top in ("include", "src", "tools", "python"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES + (".py",):
                continue
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text(encoding="utf-8")
            n = len(text.split("\n")) - (1 if text.endswith("\n") else 0)
            if n > MAX_LINES and rel not in LONG_FILES:
                findings.append(f"{rel}: {n} lines (more than {MAX_LINES})")
            if path.suffix != ".py" and not rel.startswith(SCRIPT_ROOMS) and EVAL_RE.search(blank_out(text)):
                findings.append(f"{rel}: runs a script (.eval): only include/memcuda/detail/store/ does")
            functions = python_functions(text) if path.suffix == ".py" else cpp_functions(text)
            for name, first, count in functions:
                if count <= MAX_FUNCTION_LINES:
                    continue
                long_seen.add(f"{rel}:{name}")
                if f"{rel}:{name}" not in LONG_FUNCTIONS:
                    findings.append(f"{rel}:{first}: {name} is {count} lines (more than {MAX_FUNCTION_LINES})")
            if n > MAX_LINES:
                long_seen.add(rel)
    for key in sorted(set(LONG_FUNCTIONS) | set(LONG_FILES)):
        if key not in long_seen:
            findings.append(f"check-tree.py excepts {key}, which is not over the limit (any more): take it off")
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
