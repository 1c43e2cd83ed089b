"""GPU tests (cuda backend): torch CUDA tensors both ways with a C++ process,
a stream-ordered consumer of a slow producer (one tensor, and a state dict
through its one batch), bf16 through torch.from_dlpack,
a state dict shared to 4 Python processes, CuPy reading the same tensor.
Skipped, with the reason, where there is no CUDA build or device."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import memcuda
from conftest import PKG, fields, gpu_torch

torch, pytestmark = gpu_torch()


def test_cpp_creates_torch_reads(greg, worker_factory):
    w = worker_factory("--no-control", "--backend", "cuda")
    w.cmd("create g.a 4,256 1.5")
    t = greg.get("g.a", dtype="f32")
    x = torch.from_dlpack(t)
    assert x.is_cuda and x.shape == (4, 256) and x.data_ptr() == t.data_ptr
    assert x.sum().item() == 1.5 * 1024
    assert t.__cuda_array_interface__["data"][0] == t.data_ptr


def test_torch_creates_cpp_reads(greg, worker_factory):
    src = torch.arange(1024, dtype=torch.float32, device="cuda")
    t = greg.put("g.b", src)
    assert t.backend == "cuda" and t.device == 0
    torch.cuda.synchronize()  # the worker reads on its own stream, unordered
    w = worker_factory("--no-control", "--backend", "cuda")
    got = fields(w.cmd("get g.b"))
    assert float(got["sum"]) == 1023 * 1024 / 2 and int(got["gen"]) == t.generation


SLOW_PRODUCER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {pkg!r})
    import memcuda
    reg = memcuda.Registry({url!r}, {ns!r}, control_thread=False)
    t = reg.create({name!r}, ({n},), "f32", device=0)
    x = torch.from_dlpack(t)
    x.zero_()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(3e9))   # about 1-2 s of GPU time before the write
        x.fill_(7.0)
    t.publish(s)                      # no host synchronisation
    print("READY", flush=True)
    sys.stdin.read()                  # stay alive until the consumer is done
""")


def _start(template, redis_url, namespace, n, **names):
    code = template.format(pkg=PKG, url=redis_url, ns=namespace, n=n, **names)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "READY"
    return p


def _stop(p):
    p.stdin.close()
    p.wait(timeout=60)


def _unordered_view(t):
    """A torch view of `t` that orders nothing: __dlpack__(stream=-1) skips
    the stream wait that torch.from_dlpack would ask for. Whatever ordering
    a test sees then comes from the call under test alone."""
    return torch.utils.dlpack.from_dlpack(t.__dlpack__(stream=-1))


def test_stream_ordered_consumer_of_a_slow_producer(greg, redis_url, namespace):
    n = 1 << 20
    p = _start(SLOW_PRODUCER, redis_url, namespace, n, name="g.slow")
    try:
        s = torch.cuda.Stream()
        t = greg.get("g.slow", stream=s)  # the only ordering: s waits for the producer's event
        with torch.cuda.stream(s):
            total = _unordered_view(t).sum()
        s.synchronize()
        assert total.item() == 7.0 * n
    finally:
        _stop(p)


def test_negative_control_a_consumer_that_skips_the_wait_reads_before_the_write(greg, redis_url, namespace):
    """The test above can fail: the same producer and read, with the stream
    wait left out, reads the tensor while the producer's stream still sleeps
    (zeros, or a part of the 7.0s), not 7.0 everywhere. The producer sleeps
    1-2 s of GPU time, so the first try nearly always shows it; three tries
    make a slow start of the reader's kernel harmless. Were get(stream=)
    to order nothing, the test above would read what this one reads."""
    n = 1 << 20
    seen = []
    for i in range(3):
        name = f"g.unordered{i}"
        p = _start(SLOW_PRODUCER, redis_url, namespace, n, name=name)
        try:
            s = torch.cuda.Stream()
            t = greg.get(name)  # no stream: nothing waits for the producer
            with torch.cuda.stream(s):
                total = _unordered_view(t).sum()
            s.synchronize()
            seen.append(total.item())
        finally:
            _stop(p)
        if seen[-1] != 7.0 * n:
            break
    assert any(v != 7.0 * n for v in seen), f"every unordered read saw the finished write: {seen}"


SLOW_STATE_DICT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {pkg!r})
    import memcuda
    reg = memcuda.Registry({url!r}, {ns!r}, control_thread=False)
    ts = reg.create_many([({prefix!r} + k, ({n},), "f32") for k in "abc"], device=0)
    xs = [torch.from_dlpack(t) for t in ts]
    for x in xs:
        x.zero_()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(3e9))   # about 1-2 s of GPU time before the writes
        for x in xs:
            x.fill_(7.0)
    for t in ts:
        t.publish(s)                  # no host synchronisation
    print("READY", flush=True)
    sys.stdin.read()
""")


def test_state_dict_is_stream_ordered_without_a_round_trip_per_tensor(greg, redis_url, namespace):
    """get_state_dict(framework="torch") orders torch's current stream after
    each tensor's publish through the events its one batch read (wait_opened)."""
    n = 1 << 20
    p = _start(SLOW_STATE_DICT, redis_url, namespace, n, prefix="g.sd/")
    try:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            sd = greg.get_state_dict("g.sd/", framework="torch")
            total = sum(v.sum() for v in sd.values())
        s.synchronize()
        assert sorted(sd) == ["a", "b", "c"]
        assert total.item() == 7.0 * n * 3
    finally:
        _stop(p)


def test_negative_control_a_state_dict_read_without_its_events_reads_before_the_writes(greg, redis_url, namespace):
    """The test above can fail: the same dict opened as plain memcuda Tensors
    (framework=None orders nothing) and viewed without a stream wait is read
    while the producer's stream still sleeps, so its sum is not 3 x 7.0 x n.
    Were framework="torch" to skip the events its batch read, the test above
    would read what this one reads."""
    n = 1 << 20
    seen = []
    for i in range(3):
        prefix = f"g.sdu{i}/"
        p = _start(SLOW_STATE_DICT, redis_url, namespace, n, prefix=prefix)
        try:
            s = torch.cuda.Stream()
            sd = greg.get_state_dict(prefix)  # memcuda Tensors: no stream waits
            with torch.cuda.stream(s):
                total = sum(_unordered_view(t).sum() for t in sd.values())
            s.synchronize()
            seen.append(total.item())
        finally:
            _stop(p)
        if seen[-1] != 7.0 * n * 3:
            break
    assert any(v != 7.0 * n * 3 for v in seen), f"every unordered read saw the finished writes: {seen}"


def test_bf16_through_torch_from_dlpack(greg):
    src = torch.randn(64, 32, device="cuda").to(torch.bfloat16)
    keep = greg.put("g.bf", src)  # the creator's reference: dropped at once, the tensor would go
    y = torch.from_dlpack(greg.get("g.bf", dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.is_cuda and torch.equal(y, src)
    assert y.data_ptr() == torch.from_dlpack(keep).data_ptr()  # same memory, no copy


CONSUMER = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {pkg!r})
    import memcuda
    reg = memcuda.Registry({url!r}, {ns!r}, control_thread=False)
    sd = reg.get_state_dict("sd/", framework="torch")
    print(json.dumps({{k: [str(v.dtype), list(v.shape), v.double().sum().item()] for k, v in sd.items()}}), flush=True)
""")


def test_state_dict_to_four_python_processes(greg, redis_url, namespace):
    torch.manual_seed(0)
    sd = {f"layers.{i}.{p}": torch.randn(128, 64, device="cuda").to(torch.bfloat16 if i % 2 else torch.float32)
          for i in range(4) for p in ("w", "b")}
    keep = greg.put_state_dict("sd/", sd)
    torch.cuda.synchronize()
    want = {k: [str(v.dtype), list(v.shape), v.double().sum().item()] for k, v in sd.items()}
    code = CONSUMER.format(pkg=PKG, url=redis_url, ns=namespace)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        got = json.loads(out)
        assert sorted(got) == sorted(want)
        for k, (dtype, shape, total) in want.items():
            assert got[k][:2] == [dtype, shape], k
            assert math.isclose(got[k][2], total, rel_tol=1e-9, abs_tol=1e-9), k
    assert len(keep) == 8


def test_packed_state_dict_views_on_cuda(greg):
    """A packed (>= 64 MiB) mixed-dtype dict comes back as views of one DLPack
    import per allocation: same device memory, same values, bool as uint8."""
    sd = {"w": torch.randn(4096, 4096, device="cuda").to(torch.bfloat16),  # 32 MiB
          "u": torch.randn(2048, 4096, device="cuda"),                      # 32 MiB
          "n": torch.arange(5, device="cuda", dtype=torch.int64),
          "m": torch.tensor([True, False], device="cuda"),
          "s": torch.tensor(3.5, device="cuda", dtype=torch.float16)}
    made = greg.put_state_dict("g.pk/", sd, persistent=True)
    torch.cuda.synchronize()
    assert len({made[k]._base for k in sd}) == 1  # one allocation
    ptrs = {k: made[k].data_ptr for k in sd}
    got = greg.get_state_dict("g.pk/", framework="torch")
    for k, v in sd.items():
        want = v.to(torch.uint8) if v.dtype == torch.bool else v
        assert got[k].is_cuda and got[k].dtype == want.dtype and got[k].shape == want.shape, k
        assert got[k].data_ptr() == ptrs[k], k
        assert torch.equal(got[k], want), k
    del got, made
    for k in sd:
        greg.remove("g.pk/" + k)


def test_tp_shards_on_cuda_equal_torch_slicing(greg):
    src = torch.arange(64 * 96, dtype=torch.float32, device="cuda").reshape(64, 96)
    greg.put("g.tp", src, persistent=True)
    torch.cuda.synchronize()
    for dim in (0, 1):
        for rank in range(4):
            v = greg.get_shard("g.tp", dim, rank, 4).torch()
            assert v.is_cuda and v.stride() == (96, 1)
            assert torch.equal(v, src.chunk(4, dim)[rank])
    greg.put_state_dict("g.sd/", {"qkv.weight": src}, persistent=True)
    sd = greg.get_state_dict("g.sd/", "torch", shard=memcuda.Shard(3, 4, {"*.weight": 1}))
    assert torch.equal(sd["qkv.weight"], src[:, 72:])
    # A dict not packed (one allocation per tensor): each view cut from its own import.
    greg.put("g.np/a.weight", src, persistent=True)
    greg.put("g.np/b.weight", src + 1, persistent=True)
    torch.cuda.synchronize()
    sd = greg.get_state_dict("g.np/", "torch", shard=memcuda.Shard(1, 4, {"*.weight": -1}))
    assert torch.equal(sd["a.weight"], src[:, 24:48]) and torch.equal(sd["b.weight"], src[:, 24:48] + 1)
    # Host copies of a CUDA shard: one 2D copy, a single column too.
    with pytest.warns(memcuda.ZeroCopyWarning):
        host = greg.get_shard("g.tp", 1, 1, 4).numpy(allow_copy=True)
    assert (host == src[:, 24:48].cpu().numpy()).all()
    col = np.frombuffer(greg.get_shard("g.tp", 1, 5, 96).tobytes(), np.float32)
    assert (col == src[:, 5].cpu().numpy()).all()


def test_replica_on_the_readers_device(greg):
    """A data-parallel reader on GPU 1 asks for its local copy of a tensor on
    GPU 0 (two GPUs; one GPU: the tensor serves its own device)."""
    src = torch.arange(1 << 16, dtype=torch.float32, device="cuda:0")
    greg.put("g.rep", src, persistent=True)
    torch.cuda.synchronize()
    if torch.cuda.device_count() < 2:
        assert greg.replicate("g.rep", [0]) == 0
        assert greg.get("g.rep", local=True, device=0).name == "g.rep"
        pytest.skip("needs 2 GPUs for a replica, this host has 1 (the one-GPU part passed)")
    assert greg.replicate("g.rep", [1]) == 1
    s = torch.cuda.Stream(device=1)
    t = greg.get("g.rep", local=True, device=1, stream=s)
    assert t.name.startswith(".memcuda-rep/") and t.name.endswith("/g.rep")
    with torch.cuda.device(1):
        s.synchronize()
        x = torch.from_dlpack(t)
    assert x.device == torch.device("cuda:1")
    assert torch.equal(x.cpu(), src.cpu())
    assert greg.drop_replicas("g.rep", [1]) == 1
    for n in ("g.rpx.a", "g.rpx.b"):
        greg.put(n, src, persistent=True)
    torch.cuda.synchronize()
    assert greg.replicate("g.rpx.", [1], prefix=True) == 2
    assert greg.drop_replicas("g.rpx.", [1], prefix=True) == 2
    assert greg.get("g.rpx.a", local=True, device=1).name == "g.rpx.a"


def test_model_versions_replicated_before_the_flip(greg):
    """A version asked on GPU 1 is copied there before it is current; a
    reader there opens its copies (one GPU: the version serves its own
    device, and the local open is the plain one)."""
    two = torch.cuda.device_count() >= 2
    dev = 1 if two else 0
    w = torch.full((1 << 16,), 3.0, device="cuda:0")
    assert greg.publish_model("g.abr/", {"w": w}, replicas=[dev]) == 1
    with greg.open_model("g.abr/", framework="torch", local=True, device=dev) as m:
        t = m.tensors["w"]
        assert t.device == torch.device("cuda", dev)
        assert torch.equal(t.cpu(), w.cpu())
        assert greg.publish_model("g.abr/", {"w": w + 1}, replicas=[dev]) == 2
        assert m.advance()
        assert torch.equal(m.tensors["w"].cpu(), (w + 1).cpu())
        assert torch.equal(t.cpu(), w.cpu())  # the pinned copy of version 1 is untouched
    if not two:
        pytest.skip("needs 2 GPUs for a replica, this host has 1 (the one-GPU part passed)")


def test_cupy_reads_the_same_tensor(greg):
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    src = torch.arange(100, dtype=torch.float32, device="cuda")
    t = greg.put("g.cp", src)
    torch.cuda.synchronize()
    a = cupy.from_dlpack(greg.get("g.cp"))
    b = cupy.asarray(greg.get("g.cp"))  # __cuda_array_interface__
    assert int(a.data.ptr) == t.data_ptr == int(b.data.ptr)
    assert float(a.sum()) == 4950.0 and float(b.sum()) == 4950.0
    grid = torch.arange(64 * 96, dtype=torch.float32, device="cuda").reshape(64, 96)
    greg.put("g.cp2", grid, persistent=True)
    torch.cuda.synchronize()
    c = cupy.asarray(greg.get_shard("g.cp2", 1, 1, 4))  # byte strides in __cuda_array_interface__
    assert c.strides == (96 * 4, 4)
    assert bool((c == cupy.from_dlpack(grid[:, 24:48].contiguous())).all())


@pytest.mark.gpu
def test_torch_cuda_tensor_shared_without_copy_read_with_cupy(redis_url, namespace):
    """Registry.share of a caching-allocator tensor: no new device memory, and a
    second process opens it (legacy CUDA IPC) and reads it with CuPy."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not memcuda.has_cuda():
        pytest.skip("no CUDA device, or libmemcuda_c built without CUDA")
    import subprocess
    import sys
    import textwrap
    reg = memcuda.Registry(redis_url, namespace, default_backend="cuda")
    try:
        t = torch.arange(1 << 16, device="cuda", dtype=torch.float32)[1024:]  # an offset into its block
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        h = reg.share("gsh.t", t)
        assert torch.cuda.memory_allocated() == before  # no copy
        assert h.generation > 0
        reader = textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {PKG!r})
            try:
                import cupy
            except ImportError:
                print("SKIP no cupy"); sys.exit(0)
            import memcuda
            r = memcuda.Registry({redis_url!r}, {namespace!r}, control_thread=False)
            a = cupy.from_dlpack(r.get("gsh.t"))
            print("SUM", float(a.sum()))
        """)
        out = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        if out.stdout.startswith("SKIP"):
            pytest.skip("cupy is not installed")
        assert float(out.stdout.split()[1]) == float(t.sum().item())
        del h
    finally:
        reg.close()


@pytest.mark.gpu
def test_borrowed_cuda_tensor_after_its_owner_is_killed(redis_url, namespace):
    """The documented outcome of a borrowed tensor's owner dying (docs/design.md,
    "Borrowed tensors"): a mapping already open keeps reading (the driver's
    rule for legacy IPC), and the next open of the name raises Lost once the
    allocator of record has seen the death."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not memcuda.has_cuda():
        pytest.skip("no CUDA device, or libmemcuda_c built without CUDA")
    owner_src = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {PKG!r})
        import torch, memcuda
        reg = memcuda.Registry({redis_url!r}, {namespace!r}, default_backend="cuda", session_ttl=0.6)
        t = torch.full((4096,), 2.0, device="cuda")
        torch.cuda.synchronize()
        h = reg.share("gdead.t", t)
        print("READY", flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", owner_src], stdout=subprocess.PIPE, text=True)
    reg = None
    try:
        assert owner.stdout.readline().strip() == "READY"
        # This registry takes over as allocator of record when the owner dies.
        reg = memcuda.Registry(redis_url, namespace, default_backend="cuda", session_ttl=0.6, gc_interval=0.2)
        opened = torch.from_dlpack(reg.get("gdead.t"))
        assert float(opened.sum().item()) == 2.0 * 4096
        owner.kill()
        owner.wait(timeout=30)
        import time
        # A registry of its own: `reg` would share the handle it already holds.
        fresh = memcuda.Registry(redis_url, namespace, control_thread=False)
        deadline, lost = time.monotonic() + 30, None
        try:
            while time.monotonic() < deadline and lost is None:
                try:
                    fresh.get("gdead.t").release()
                except memcuda.Lost as e:
                    lost = e
                time.sleep(0.1)
        finally:
            fresh.close()
        assert lost is not None, "the next open never raised Lost after the owner's kill -9"
        # The mapping opened before the death still reads (the driver keeps it).
        assert float(opened.sum().item()) == 2.0 * 4096
    finally:
        if owner.poll() is None:
            owner.kill()
        if reg is not None:
            reg.close()


@pytest.mark.gpu
def test_torch_expandable_segment_tensor_shared_by_its_cumem_fd(redis_url, namespace):
    """A tensor of PyTorch's expandable segments (cuMem memory, no legacy IPC
    handle) is shared without a copy through its physical allocation's fd."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not memcuda.has_cuda():
        pytest.skip("no CUDA device, or libmemcuda_c built without CUDA")
    owner_src = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {PKG!r})
        import torch, memcuda
        reg = memcuda.Registry({redis_url!r}, {namespace!r}, default_backend="cuda")
        t = torch.arange(4096, device="cuda", dtype=torch.float32)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        try:
            h = reg.share("gexp.t", t)
        except memcuda.InvalidArgument as e:
            print("REFUSED", e, flush=True)
            sys.exit(0)
        print("READY", torch.cuda.memory_allocated() - before, flush=True)
        sys.stdin.readline()
    """)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    owner = subprocess.Popen([sys.executable, "-c", owner_src], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        line = owner.stdout.readline().split()
        assert line and line[0] == "READY", f"the owner answered {line}"
        assert line[1] == "0"  # no new memory
        from conftest import find_program
        cli = find_program("MEMCUDA_CLI", "build*/tools/memcuda")
        if cli and os.path.exists(cli):  # shared by its cuMem fd, not legacy IPC
            out = subprocess.run([cli, "--url", redis_url, "--namespace", namespace, "--json", "info", "gexp.t"],
                                 capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["alloc_kind"] == "cuda_vmm_fd", out.stdout
        reg = memcuda.Registry(redis_url, namespace, control_thread=False)
        try:
            got = torch.from_dlpack(reg.get("gexp.t"))
            assert float(got.sum().item()) == float(sum(range(4096)))
            del got
        finally:
            reg.close()
    finally:
        try:
            owner.stdin.write("\n")
            owner.stdin.flush()
        except BrokenPipeError:
            pass
        owner.wait(timeout=60)
