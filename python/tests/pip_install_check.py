"""CTest python_pip_install: `pip install ./python` gives a package that works.

Copies the source tree (what git tracks, else everything but build trees)
into a temporary folder, so nothing built before is reused, makes a venv
with --system-site-packages, runs
`pip install --no-build-isolation --no-index ./python` in it (setup.py builds
libmemcuda_c with CMake), then, in that venv and outside the source tree,
imports memcuda and does a round trip between two processes through a
private redis-server with the host backend. `pip wheel` must then give a
py3-none-<platform> wheel holding the library.

Exits 77 (CTest: skipped) with the reason when python3-venv, pip,
setuptools, wheel or redis-server is missing. ccache, when present, serves
the compiler (CCACHE_BASEDIR makes the temporary paths hit the cache)."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from private_redis import NoRedisServer, private_redis  # noqa: E402

SKIP = 77
NAME = "pip.roundtrip"
VALUES = [i * 0.5 - 3 for i in range(12)]  # f32-exact

PRODUCER = textwrap.dedent("""
    import ctypes, struct, sys, memcuda
    reg = memcuda.Registry(sys.argv[1], sys.argv[2], default_backend="host")
    values = [float(v) for v in sys.argv[3].split(",")]
    t = reg.create({name!r}, (3, 4), "f32")
    buf = (ctypes.c_float * len(values))(*values)
    t.copy_from_host(ctypes.addressof(buf), ctypes.sizeof(buf))
    print("READY", memcuda.__file__, memcuda.library_path, flush=True)
    sys.stdin.readline()  # the consumer has run: print what this process sees now
    print("SEES", ",".join(repr(v) for v in struct.unpack("12f", t.tobytes())), flush=True)
""").format(name=NAME)

CONSUMER = textwrap.dedent("""
    import ctypes, struct, sys, memcuda
    reg = memcuda.Registry(sys.argv[1], sys.argv[2], default_backend="host")
    t = reg.get({name!r}, dtype="f32")
    assert t.backend == "host" and t.shape == (3, 4), (t.backend, t.shape)
    print("GOT", ",".join(repr(v) for v in struct.unpack("12f", t.tobytes())), flush=True)
    buf = (ctypes.c_float * 12)(*[-v for v in struct.unpack("12f", t.tobytes())])
    t.copy_from_host(ctypes.addressof(buf), ctypes.sizeof(buf))  # the producer's memory too
""").format(name=NAME)


def skip(why: str) -> None:
    print(f"SKIPPED: {why}", flush=True)
    sys.exit(SKIP)


def fail(why: str) -> None:
    print(f"FAILED: {why}", flush=True)
    sys.exit(1)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join("<script>" if "\n" in c else c for c in cmd), flush=True)
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", **kw)


def copy_sources(dst: str) -> None:
    """The tree a fresh clone (plus local edits) has: no build output."""
    listed = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) if shutil.which("git") else None
    if listed is not None and listed.returncode == 0 and listed.stdout:
        for rel in filter(None, listed.stdout.decode().split("\0")):
            src = os.path.join(REPO, rel)
            if os.path.isfile(src):
                os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
                shutil.copy2(src, os.path.join(dst, rel))
        return

    def ignored(folder: str, names: list) -> set:
        top = os.path.samefile(folder, REPO) or os.path.samefile(folder, os.path.join(REPO, "python"))
        return {n for n in names if n in (".git", "__pycache__", "libmemcuda_c.so") or n.endswith(".egg-info")
                or (top and n.startswith("build"))}
    shutil.copytree(REPO, dst, ignore=ignored)


def clean_env(src: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "MEMCUDA_", "PYTHON", "CMAKE_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PYTHONDONTWRITEBYTECODE="1")
    if shutil.which("ccache"):
        for lang in ("C", "CXX", "CUDA"):
            env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = "ccache"
        env["CCACHE_BASEDIR"] = src
    return env


def main() -> int:
    if not shutil.which("redis-server") and not os.environ.get("MEMCUDA_TEST_REDIS_SERVER"):
        skip("redis-server not found (Debian: apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="memcuda-pip-") as tmp:
        venv, src = os.path.join(tmp, "venv"), os.path.join(tmp, "src")
        made = run([sys.executable, "-m", "venv", "--system-site-packages", venv])
        if made.returncode != 0:
            print(made.stdout)
            if "ensurepip" in made.stdout or "No module named venv" in made.stdout:
                skip(f"{sys.executable} cannot make a venv (Debian: apt-get install python3-venv)")
            fail("python3 -m venv failed")
        vpy = os.path.join(venv, "bin", "python")
        for mod, pkg in (("pip", "python3-pip"), ("setuptools", "python3-setuptools"), ("wheel", "python3-wheel")):
            if subprocess.run([vpy, "-c", f"import {mod}"], stderr=subprocess.DEVNULL).returncode != 0:
                skip(f"the venv has no {mod} (Debian: apt-get install {pkg})")
        copy_sources(src)
        env = clean_env(src)

        pip = run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-index", "./python"], cwd=src, env=env)
        print(pip.stdout)
        if pip.returncode != 0:
            fail(f"pip install exited {pip.returncode}")

        try:
            with private_redis("memcuda-pip-redis-") as url:
                roundtrip(vpy, url, os.path.join(venv, "lib"), env, tmp)
        except NoRedisServer as e:
            skip(str(e))

        wheels = os.path.join(tmp, "wheels")
        built = run([vpy, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps", "-w", wheels,
                     "./python"], cwd=src, env=env)
        found = glob.glob(os.path.join(wheels, "memcuda-*-py3-none-linux_*.whl"))
        if built.returncode != 0 or len(found) != 1:
            print(built.stdout)
            fail(f"pip wheel exited {built.returncode}, made {os.listdir(wheels) if os.path.isdir(wheels) else []}")
        if "memcuda/libmemcuda_c.so" not in zipfile.ZipFile(found[0]).namelist():
            fail(f"{found[0]} holds no memcuda/libmemcuda_c.so")
        print(f"wheel: {os.path.basename(found[0])}")
    print("PASSED: pip install ./python, import, a round trip between two processes, pip wheel")
    return 0


def roundtrip(vpy: str, url: str, site: str, env: dict, cwd: str) -> None:
    """Producer and consumer in the venv, run from a folder outside the sources."""
    ns = f"pip{os.getpid()}"
    want = ",".join(repr(float(v)) for v in VALUES)
    producer = subprocess.Popen([vpy, "-c", PRODUCER, url, ns, want], cwd=cwd, env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        ready = producer.stdout.readline().split()
        print("producer:", *ready, flush=True)
        if len(ready) != 3 or ready[0] != "READY":
            fail(f"the producer did not start (exit {producer.wait()})")
        module, library = ready[1], ready[2]
        if not module.startswith(site) or os.path.dirname(library) != os.path.dirname(module):
            fail(f"memcuda was imported from {module} with {library}: not the package installed in the venv")
        consumer = run([vpy, "-c", CONSUMER, url, ns], cwd=cwd, env=env, timeout=120)
        print("consumer:", consumer.stdout.strip(), flush=True)
        if consumer.returncode != 0 or consumer.stdout.split() != ["GOT", want]:
            fail(f"the consumer (exit {consumer.returncode}) did not read {want}")
        out, _ = producer.communicate("\n", timeout=120)
        print("producer:", out.strip(), flush=True)
        negated = ",".join(repr(-float(v)) for v in VALUES)
        if out.split() != ["SEES", negated]:
            fail(f"the producer does not see the consumer's write ({negated}): one memory, two processes")
    finally:
        if producer.poll() is None:
            producer.kill()
        producer.wait()


if __name__ == "__main__":
    sys.exit(main())
