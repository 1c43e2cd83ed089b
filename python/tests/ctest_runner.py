"""Runs the pytest suite for CTest: `ctest_runner.py cpu|gpu`.

Exits 77 (CTest: skipped) with the reason when the suite cannot run here:
no pytest or numpy for this interpreter, or (gpu) no usable CUDA device, or
every selected test skipped.

Where the interpreter has no pytest (the GPU hosts' Python has none),
MEMCUDA_PYTEST_PATH (colon-separated) names directories holding a copy of
Debian's pure-Python pytest, made by python/tests/stage_pytest.sh."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def skip(why: str) -> None:
    print(f"SKIPPED: {why}", flush=True)
    sys.exit(SKIP)


def main() -> int:
    kind = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    extra = [p for p in os.environ.get("MEMCUDA_PYTEST_PATH", "").split(":") if p]
    sys.path[1:1] = extra  # after the script's own directory
    for mod, pkg in (("pytest", "python3-pytest"), ("numpy", "python3-numpy")):
        try:
            __import__(mod)
        except ImportError:
            skip(f"{sys.executable} has no {mod} (Debian: apt-get install {pkg})")
    # The suite uses no third-party plugin; one installed beside the
    # interpreter (e.g. a pytest-timeout newer than the staged pytest, as on
    # the GPU hosts' venv) must not break or change the run.
    os.environ.setdefault("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    import pytest

    class Outcomes:
        def __init__(self) -> None:
            self.ran = self.skipped = 0

        def pytest_runtest_logreport(self, report) -> None:
            if report.when == "call" and not report.skipped:
                self.ran += 1
            elif report.skipped:
                self.skipped += 1

    seen = Outcomes()
    marker = "gpu" if kind == "gpu" else "not gpu"
    rc = pytest.main(["-rs", "-v", "-p", "no:cacheprovider", "-m", marker, HERE], plugins=[seen])
    if rc == 0 and seen.ran == 0:
        skip(f"every {kind} test was skipped (reasons above)")
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
