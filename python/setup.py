"""Builds libmemcuda_c.so with CMake while pip builds the package, so that
`pip install ./python` gives a package that imports. The metadata lives in
pyproject.toml; this file only adds the CMake step (docs/python.md).

The library is built from the repository around python/ (its top-level
CMakeLists.txt), in a private build folder under setuptools' build_temp, with
only the target memcuda_c: the CUDA backend when the toolkit is found, else
host only. MEMCUDA_CMAKE_ARGS adds configure arguments (e.g.
-DMEMCUDA_CUDA=OFF). A source distribution is not supported: it would lack
the C++ sources, which live outside python/.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIBNAME = "libmemcuda_c.so"
PLUGIN = "libmemcuda_ucx.so"
# Everything but the library and what it links: no tests, tools or install rules.
CONFIGURE = ["-DCMAKE_BUILD_TYPE=Release", "-DMEMCUDA_BUILD_C_API=ON", "-DMEMCUDA_BUILD_TESTS=OFF",
             "-DMEMCUDA_BUILD_EXAMPLES=OFF", "-DMEMCUDA_BUILD_BENCHMARKS=OFF", "-DMEMCUDA_BUILD_FUZZERS=OFF",
             "-DMEMCUDA_BUILD_TOOLS=OFF", "-DMEMCUDA_INSTALL=OFF", "-DMEMCUDA_BUILD_PYTHON=OFF"]


def build_library(build_dir: str) -> str:
    """Configures and builds memcuda_c in build_dir; returns the .so's path."""
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        raise SystemExit(f"memcuda: {REPO} has no CMakeLists.txt: build the package from a checkout of "
                         "the repository (pip install ./python), not from a copy of python/ alone")
    cmake = shutil.which("cmake")
    if not cmake:
        raise SystemExit("memcuda: cmake not found (Debian: apt-get install cmake); it builds libmemcuda_c.so")
    # Configured every time, so that MEMCUDA_CMAKE_ARGS applies to a reused folder too.
    fresh = not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt"))
    gen = ["-G", "Ninja"] if fresh and shutil.which("ninja") and "CMAKE_GENERATOR" not in os.environ else []
    extra = shlex.split(os.environ.get("MEMCUDA_CMAKE_ARGS", ""))
    # --parallel with no number takes CMAKE_BUILD_PARALLEL_LEVEL when it is set.
    jobs = [] if "CMAKE_BUILD_PARALLEL_LEVEL" in os.environ else [str(os.cpu_count() or 1)]
    try:
        subprocess.check_call([cmake, "-S", REPO, "-B", build_dir, *gen, *CONFIGURE, *extra])
        subprocess.check_call([cmake, "--build", build_dir, "--target", "memcuda_c", "--parallel", *jobs])
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"memcuda: building libmemcuda_c.so failed ({e}; CMake's output above). It needs "
                         "cmake, a C++20 compiler and the dev packages of hiredis, Boost.JSON and DLPack "
                         "(Debian: libhiredis-dev libboost-json1.81-dev libdlpack-dev); see docs/python.md") from e
    return os.path.join(build_dir, "src", "c_api", LIBNAME)


class BuildWithLibrary(build_py):
    """build_py, then libmemcuda_c.so built and copied next to the modules."""

    def run(self) -> None:
        super().run()
        build_dir = os.path.join(self.get_finalized_command("build").build_temp, "cmake")
        lib = build_library(os.path.abspath(build_dir))
        # An editable install imports from python/memcuda itself.
        dest = os.path.join(HERE if getattr(self, "editable_mode", False) else self.build_lib, "memcuda")
        os.makedirs(dest, exist_ok=True)
        self.copy_file(lib, os.path.join(dest, LIBNAME))
        # The UCX byte mover of fleets, where mem-cuda was built with UCX: a
        # plugin libmemcuda_c loads from beside itself when it needs one.
        plugin = os.path.join(os.path.dirname(lib), PLUGIN)
        if os.path.isfile(plugin):
            self.copy_file(plugin, os.path.join(dest, PLUGIN))


class NoSdist(sdist):
    def run(self) -> None:
        raise SystemExit("memcuda: no source distribution: the C++ sources live outside python/. "
                         "Install from a checkout (pip install ./python) or build a wheel (pip wheel ./python)")


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: a platform wheel, not a pure one."""

    def has_ext_modules(self) -> bool:
        return True


cmdclass = {"build_py": BuildWithLibrary, "sdist": NoSdist}
try:  # ctypes, no Python C API: one wheel serves every Python 3 (tag py3-none-<platform>)
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        def get_tag(self) -> tuple:
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:
    pass

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
