"""memcuda.torch on the cuda backend: eight consumer processes attach a CUDA
module zero copy and each sees an in-place publish that the producer
enqueued behind a 1-2 s kernel, ordered on its stream by Attachment.wait
(no host synchronisation); the negative control reads without the wait and
sees the old weights. Skipped, with the reason, where there is no CUDA build
or device (the conventions of test_gpu.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import memcuda
from conftest import HERE, PKG, gpu_torch

torch, pytestmark = gpu_torch()


CONSUMER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{pkg!r}, {here!r}]
    import torch, memcuda, memcuda.torch as mt
    from torch_nets import Net, digest
    reg = memcuda.Registry({url!r}, {ns!r}, control_thread=False)
    m = Net(seed=99).cuda()
    att = mt.attach(m, reg, {prefix!r})
    held = reg.get_state_dict({prefix!r})
    zero_copy = all(v.data_ptr() == held[k].data_ptr for k, v in m.state_dict().items() if k != "head.weight")
    tied = m.head.weight is m.emb.weight and m.emb.weight.is_cuda
    del held
    ptrs = {{k: v.data_ptr() for k, v in m.state_dict().items()}}
    print(json.dumps({{"version": att.version, "digest": digest(m), "zero_copy": zero_copy, "tied": tied}}),
          flush=True)
    s = torch.cuda.Stream()
    if {wait!r}:
        v = att.wait(timeout=60, stream=s)  # s waits for the producer's writes; the host does not
    else:
        sys.stdin.readline()                # the producer has published (its stream still sleeps)
        v = None
    with torch.cuda.stream(s):
        sums = {{k: t.detach().double().sum() for k, t in m.state_dict().items()}}
    s.synchronize()
    got = {{k: [str(t.dtype), list(t.shape), sums[k].item()] for k, t in m.state_dict().items()}}
    same = ptrs == {{k: t.data_ptr() for k, t in m.state_dict().items()}}
    print(json.dumps({{"version": v, "digest": got, "same_memory": same}}), flush=True)
""")


def _consumer(redis_url, namespace, prefix, wait):
    code = CONSUMER.format(pkg=PKG, here=HERE, url=redis_url, ns=namespace, prefix=prefix, wait=wait)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _slow_publish(src, reg, prefix, factor):
    """Scales src on the current stream, then publishes it in place on a
    stream that first sleeps 1-2 s of GPU time: publish returns long before
    the registry tensors hold the new weights."""
    from torch_nets import scale_
    scale_(src, factor)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(3e9))
    return memcuda.torch.publish(src, reg, prefix, stream=s)


def test_eight_attached_processes_see_a_stream_ordered_in_place_publish(greg, redis_url, namespace):
    import memcuda.torch as mt
    from torch_nets import Net, digest
    src = Net(seed=1).cuda()
    assert mt.publish(src, greg, "gm/") == 1
    torch.cuda.synchronize()
    want1 = digest(src)
    procs = [_consumer(redis_url, namespace, "gm/", True) for _ in range(8)]
    try:
        for p in procs:
            first = json.loads(p.stdout.readline())
            assert first == {"version": 1, "digest": want1, "zero_copy": True, "tied": True}
        assert _slow_publish(src, greg, "gm/", -3.0) == 2  # no host synchronisation before the consumers read
        torch.cuda.synchronize()
        want2 = digest(src)
        assert want2 != want1
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0
            got = json.loads(out)
            assert got == {"version": 2, "digest": want2, "same_memory": True}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_negative_control_an_attached_module_that_skips_the_wait_reads_the_old_weights(greg, redis_url, namespace):
    """The test above can fail: the same consumer reading right after the
    producer's publish returned, without Attachment.wait, reads while the
    producer's stream still sleeps, so it sees the old weights (or a part of
    the new ones). Were wait() to order nothing, the test above would read
    what this one reads."""
    import memcuda.torch as mt
    from torch_nets import Net, digest
    seen = []
    for i in range(3):
        prefix = f"gn{i}/"
        src = Net(seed=1).cuda()
        mt.publish(src, greg, prefix)
        torch.cuda.synchronize()
        p = _consumer(redis_url, namespace, prefix, False)
        try:
            assert json.loads(p.stdout.readline())["version"] == 1
            _slow_publish(src, greg, prefix, -3.0)
            p.stdin.write("go\n")
            p.stdin.flush()
            out, _ = p.communicate(timeout=120)
            torch.cuda.synchronize()
            got = json.loads(out)["digest"]
            seen.append(got == digest(src))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        if not seen[-1]:
            break
    assert not all(seen), "every read without the wait saw the finished in-place publish"
