"""memcuda.torch on the host backend: a module published under a prefix,
attached zero copy by another module (in this process and in another one),
updated in place; layout errors list every difference; buffers, a bool
buffer, a non-persistent buffer and tied weights."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
from torch import nn  # noqa: E402

import memcuda  # noqa: E402
import memcuda.torch as mt  # noqa: E402
from conftest import HERE, PKG, wait_for  # noqa: E402
from torch_nets import Net, digest, scale_  # noqa: E402

NAMES = ["emb.weight", "lin.weight", "lin.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
         "bn.num_batches_tracked", "head.weight", "mask"]


def _registry_ptrs(reg, prefix):
    sd = reg.get_state_dict(prefix)
    out = {k: (t.data_ptr, t.generation) for k, t in sd.items()}
    del sd
    return out


def test_publish_then_attach_is_zero_copy(reg):
    src = Net(seed=1)
    assert mt.publish(src, reg, "m1/") == 1
    assert sorted(i.name[3:] for i in reg.list("m1/*")) == sorted(NAMES)  # the state-dict names, no "scratch"
    dst = Net(seed=2)
    scratch = dst.scratch
    emb = dst.emb.weight
    att = mt.attach(dst, reg, "m1/")
    assert att.version == 1 and att.attached
    ptrs = _registry_ptrs(reg, "m1/")
    for name, p in dst.state_dict(keep_vars=True).items():
        if name != "head.weight":
            assert p.data_ptr() == ptrs[name][0], name  # a view of the registry tensor itself
    assert digest(dst) == digest(src)
    # Parameters stay the module's own Parameter objects, with their flags.
    assert dst.emb.weight is emb and isinstance(emb, nn.Parameter) and emb.requires_grad
    # The tie survives: one Parameter under both names, on emb.weight's registry tensor.
    assert dst.head.weight is dst.emb.weight and dst.head.weight.data_ptr() == ptrs["emb.weight"][0]
    assert dst.mask.dtype == torch.bool and dst.mask.tolist() == [True, False, True]
    assert dst.scratch is scratch  # non-persistent: the process's own
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]]).view(-1)
    src.eval(), dst.eval()
    assert torch.equal(dst(idx), src(idx))


def test_publish_twice_in_place_keeps_the_registry_tensors_and_an_attached_module_sees_it(reg):
    src = Net(seed=1)
    assert mt.publish(src, reg, "m2/") == 1
    before = _registry_ptrs(reg, "m2/")
    dst = Net(seed=5)
    att = mt.attach(dst, reg, "m2/")
    bound = {k: v.data_ptr() for k, v in dst.state_dict().items()}
    scale_(src, -2.0)
    with torch.no_grad():
        src.mask.copy_(torch.tensor([False, True, False]))
        src.bn.num_batches_tracked += 10
    assert mt.publish(src, reg, "m2/") == 2
    assert _registry_ptrs(reg, "m2/") == before  # same memory, same generations: no new tensor
    assert att.wait(timeout=10) == 2 and att.version == 2
    assert {k: v.data_ptr() for k, v in dst.state_dict().items()} == bound  # nothing rebound
    assert digest(dst) == digest(src)
    assert dst.mask.tolist() == [False, True, False]
    assert att.wait(timeout=0.2) is None  # no newer version: a timeout, not an error


class Other(nn.Module):
    """Net's names, but: lin.weight of another shape, bn.running_var in f64,
    a name Net lacks (extra.weight), and no mask / head.weight (untied)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 4)
        self.lin.bias = nn.Parameter(torch.zeros(8))
        self.bn = nn.BatchNorm1d(8)
        self.bn.running_var = self.bn.running_var.double()
        self.extra = nn.Linear(2, 2, bias=False)


def test_a_mismatch_is_one_error_listing_every_name_shape_and_dtype(reg):
    mt.publish(Net(seed=1), reg, "m3/")
    dst = Other()
    kept = {k: v.data_ptr() for k, v in dst.state_dict().items()}
    with pytest.raises(memcuda.LayoutMismatch) as e:
        mt.attach(dst, reg, "m3/")
    err = e.value
    assert isinstance(err, memcuda.InvalidArgument) and err.name == "invalid_argument"
    assert err.missing == ["extra.weight"]
    assert sorted(err.unexpected) == ["head.weight", "mask"]
    assert err.mismatched == ["lin.weight: shape [8, 8] under the prefix, [4, 8] in the module",
                              "bn.running_var: dtype float32 under the prefix, float64 in the module"]
    msg = str(err)
    for text in ("5 differences", "missing under the prefix (in the module): extra.weight float32[2, 2]",
                 "unexpected under the prefix (not in the module): head.weight float32[16, 8]",
                 "unexpected under the prefix (not in the module): mask bool[3]", *err.mismatched):
        assert text in msg, msg
    assert {k: v.data_ptr() for k, v in dst.state_dict().items()} == kept  # nothing was bound
    # strict=False ignores the names, as load_state_dict does, not shapes and dtypes.
    with pytest.raises(memcuda.LayoutMismatch) as e:
        mt.attach(dst, reg, "m3/", strict=False)
    assert e.value.missing == [] and e.value.unexpected == [] and len(e.value.mismatched) == 2


def test_strict_false_binds_the_names_both_have(reg):
    src = Net(seed=1)
    mt.publish(src, reg, "m4/")
    dst = nn.Module()
    dst.lin = nn.Linear(8, 8)
    dst.other = nn.Linear(3, 3)
    other = dst.other.weight.data_ptr()
    att = mt.attach(dst, reg, "m4/", strict=False)
    assert torch.equal(dst.lin.weight, src.lin.weight) and dst.lin.weight.data_ptr() != src.lin.weight.data_ptr()
    assert dst.other.weight.data_ptr() == other
    del att


def test_publish_of_another_layout_is_refused_unless_replace(reg):
    mt.publish(Net(seed=1), reg, "m5/")
    before = _registry_ptrs(reg, "m5/")
    wider = Net(seed=1, width=4)
    with pytest.raises(memcuda.LayoutMismatch) as e:
        mt.publish(wider, reg, "m5/")
    assert "emb.weight: shape [16, 8] under the prefix, [16, 4] in the module" in str(e.value)
    assert _registry_ptrs(reg, "m5/") == before  # nothing written
    assert mt.publish(wider, reg, "m5/", replace=True) == 2  # the version sequence goes on
    after = _registry_ptrs(reg, "m5/")
    assert sorted(after) == sorted(before) and all(after[k][1] != before[k][1] for k in after)
    dst = Net(seed=3, width=4)
    mt.attach(dst, reg, "m5/")
    assert digest(dst) == digest(wider)


def test_modes_and_misuse(reg):
    src = Net(seed=1)
    with pytest.raises(memcuda.InvalidArgument, match="mode must be one of"):
        mt.publish(src, reg, "m6/", mode="blue-green")
    with pytest.raises(memcuda.NotFound, match="no tensor under 'm6/'"):
        mt.attach(Net(), reg, "m6/")
    with pytest.raises(memcuda.InvalidArgument, match="torch.nn.Module"):
        mt.publish({"w": torch.zeros(2)}, reg, "m6/")
    mt.publish(src, reg, "m6/")
    att = mt.attach(Net(), reg, "m6/")
    with pytest.raises(memcuda.InvalidArgument, match="advance"):
        att.advance()


def test_detach_gives_the_module_its_own_copy_and_lets_the_registry_go(reg):
    src = Net(seed=1)
    mt.publish(src, reg, "m7/")
    # A publish of one member unlinks the dict's record: the attach then goes
    # name by name, and each member's refcount shows this process's reference.
    # The unlinked record's pins (one reference per member) go at the next GC
    # round: wait for it, so that the baseline is each name's own reference.
    reg.get("m7/lin.weight").publish()
    reg.flush()

    def unpinned() -> bool:
        reg.collect_garbage()
        return all(i.refcount == 1 for i in reg.list("m7/*"))

    wait_for(unpinned, 10, "the unlinked record's pins to be dropped")
    base = {i.name: 1 for i in reg.list("m7/*")}
    dst = Net(seed=2)
    att = mt.attach(dst, reg, "m7/")
    reg.flush()
    assert {i.name: i.refcount for i in reg.list("m7/*")} == {k: v + 1 for k, v in base.items()}
    ptrs = _registry_ptrs(reg, "m7/")
    att.detach()
    assert not att.attached
    assert all(v.data_ptr() != ptrs[k][0] for k, v in dst.state_dict().items())
    assert digest(dst) == digest(src) and dst.head.weight is dst.emb.weight
    scale_(src, 3.0)
    mt.publish(src, reg, "m7/")
    assert digest(dst) != digest(src)  # no longer attached
    with pytest.raises(memcuda.InvalidArgument, match="detached"):
        att.wait(timeout=0)
    gc.collect()
    reg.flush()
    assert {i.name: i.refcount for i in reg.list("m7/*")} == base  # every reference given back


CONSUMER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{pkg!r}, {here!r}]
    import torch, memcuda, memcuda.torch as mt
    from torch_nets import Net, digest
    reg = memcuda.Registry({url!r}, {ns!r}, control_thread=False)
    m = Net(seed=99)
    att = mt.attach(m, reg, "mp/")
    ptrs = {{k: v.data_ptr() for k, v in m.state_dict().items()}}
    print(json.dumps({{"version": att.version, "digest": digest(m)}}), flush=True)
    v = att.wait(timeout=30)                   # the producer's next in-place publish
    same = ptrs == {{k: v.data_ptr() for k, v in m.state_dict().items()}}
    m.eval()
    out = m(torch.arange(12)).double().sum().item()
    print(json.dumps({{"version": v, "digest": digest(m), "same_memory": same, "out": out}}), flush=True)
""")


def test_an_attached_module_in_another_process_sees_an_in_place_publish(reg, redis_url, namespace):
    src = Net(seed=1)
    assert mt.publish(src, reg, "mp/") == 1
    code = CONSUMER.format(pkg=PKG, here=HERE, url=redis_url, ns=namespace)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(p.stdout.readline() or "null")
        assert first == {"version": 1, "digest": digest(src)}, p.stderr.read() if first is None else first
        scale_(src, 0.5)
        with torch.no_grad():
            src.mask.logical_not_()
        assert mt.publish(src, reg, "mp/") == 2
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        second = json.loads(out)
        assert second["version"] == 2 and second["same_memory"] is True
        assert second["digest"] == digest(src)
        src.eval()
        assert second["out"] == src(torch.arange(12)).double().sum().item()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_ab_versions_pin_an_attached_module_until_it_advances(reg):
    src = Net(seed=1)
    v1 = mt.publish(src, reg, "ab/", mode="ab")
    dst = Net(seed=2)
    att = mt.attach(dst, reg, "ab/", versions="ab")
    assert att.version == v1
    first = digest(src)
    assert digest(dst) == first
    ptr = dst.lin.weight.data_ptr()
    with pytest.raises(memcuda.InvalidArgument, match="advance"):
        att.wait(timeout=0.01)  # an A/B attachment moves with advance()
    scale_(src, 2.0)
    v2 = mt.publish(src, reg, "ab/", mode="ab")  # a second set of buffers: the attached module is untouched
    assert v2 == v1 + 1
    assert digest(dst) == first and dst.lin.weight.data_ptr() == ptr
    assert att.advance() is True  # one rebind, at the point the worker chooses
    assert att.version == v2 and digest(dst) == digest(src)
    assert dst.lin.weight.data_ptr() != ptr
    assert dst.head.weight is dst.emb.weight  # the tie survives the move
    assert att.advance() is False  # already current
    att.detach()
