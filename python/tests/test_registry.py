"""The Registry API on the host backend: create/put/get, records, errors, refcounts."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import memcuda
from memcuda._lib import lib


def test_put_get_same_bytes(reg):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.5
    t = reg.put("p.a", a)
    assert (t.name, t.dtype, t.shape, t.backend, t.device) == ("p.a", "f32", (2, 3, 4), "host", -1)
    u = reg.get("p.a", dtype="float32")
    assert u.generation == t.generation
    assert u.tobytes() == a.tobytes()
    assert np.array_equal(u.numpy(), a)
    # The two handles view one mapping: a write through one shows in the other.
    u.numpy()[1, 2, 3] = -7
    assert t.numpy()[1, 2, 3] == -7


def test_iter_list_pages_in_name_order(reg):
    ts = [reg.create(f"pg.{i}", (1,), "u8") for i in range(5)]
    assert [x.name for x in reg.iter_list("pg.*", page=2)] == [f"pg.{i}" for i in range(5)]
    assert [x.name for x in reg.list("pg.*")] == [f"pg.{i}" for i in range(5)]
    for t in ts:
        t.release()

def test_create_defaults_and_info(reg):
    t = reg.create("p.c", (4, 5), "i16", persistent=True)
    i = reg.info("p.c")
    assert (i.dtype, i.shape, i.bytes, i.refcount, i.state, i.backend) == ("i16", (4, 5), 40, 2, "ready", "host")
    assert i.generation == t.generation and i.holders >= 1
    assert t.info().name == "p.c"
    assert reg.wait("p.c", 0.5) is True
    assert reg.wait("p.nothing", 0.05) is False
    assert [x.name for x in reg.list("p.*")] == ["p.c"]
    assert [x.name for x in reg.iter_list("p.*", page=1)] == ["p.c"]
    s = reg.stats()
    assert s.leader_present and s.leader_is_self and reg.is_leader
    assert s.tensors == 1 and s.creates >= 1
    assert s.leader_session == reg.session_id
    t.release()
    reg.remove("p.c")
    reg.flush()
    with pytest.raises(memcuda.NotFound):
        reg.info("p.c")


def test_errors_map_to_classes(reg, redis_url):
    reg.create("p.e", (2,), "f32", persistent=True)
    with pytest.raises(memcuda.NotFound) as e:
        reg.get("p.none")
    assert "p.none" in str(e.value) and isinstance(e.value, LookupError)
    with pytest.raises(memcuda.AlreadyExists):
        reg.create("p.e", (2,), "f32")
    with pytest.raises(memcuda.TypeMismatch):
        reg.get("p.e", dtype="i32")
    with pytest.raises(memcuda.ProtocolError) as e:
        reg.create("bad name", (2,), "f32")
    assert isinstance(e.value, memcuda.InvalidArgument) and isinstance(e.value, ValueError)
    with pytest.raises(memcuda.InvalidArgument):
        reg.create("p.x", (2,), "complex128")
    with pytest.raises(memcuda.InvalidArgument):
        reg.create("p.x", (-1,), "f32")
    with pytest.raises(memcuda.NotFound):
        reg.remove("p.none")
    with pytest.raises(memcuda.ConnectionError) as e:
        memcuda.Registry("unix:///nonexistent/memcuda.sock", connect_timeout=0.2)
    assert isinstance(e.value, memcuda.RedisError) and isinstance(e.value, ConnectionError)
    with pytest.raises(memcuda.InvalidArgument):
        memcuda.Registry("bogus://x")
    with pytest.raises(memcuda.StaleHandle):
        t = reg.get("p.e")
        reg.remove("p.e")
        t.publish()


def test_exception_tree_mirrors_the_c_abi():
    """Every class's code, wire name and parent agree with libmemcuda_c's tables."""
    from memcuda.errors import BY_CODE
    assert sorted(BY_CODE) == list(range(1, 22))
    for code, cls in BY_CODE.items():
        assert lib.memcuda_error_name(code).decode() == cls.name
        parent = lib.memcuda_error_parent(code)
        if parent:
            assert issubclass(cls, BY_CODE[parent]) and cls.__mro__[1] is BY_CODE[parent], cls
        else:
            assert cls is memcuda.MemcudaError


def test_refcounts_return_to_baseline(reg):
    base = reg.create("p.rc", (8,), "f32", persistent=True)
    base.release()
    reg.flush()
    assert reg.info("p.rc").refcount == 1  # the name's own reference
    t = reg.get("p.rc")
    arr = np.from_dlpack(t)
    view = np.asarray(t)
    capsule = t.__dlpack__()  # never consumed: its destructor releases
    reg.flush()
    assert reg.info("p.rc").refcount == 2  # one per process, however many views
    del t, capsule
    gc.collect()
    reg.flush()
    assert reg.info("p.rc").refcount == 2  # arr and view still hold it
    del arr
    gc.collect()
    reg.flush()
    assert reg.info("p.rc").refcount == 2  # view keeps the Tensor alive
    del view
    gc.collect()
    reg.flush()
    assert reg.info("p.rc").refcount == 1


class _Holder:
    """Hands one given capsule to a DLPack consumer."""

    def __init__(self, capsule) -> None:
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_capsule_is_consumed_once(reg):
    t = reg.create("p.cap", (3,), "u8")
    holder = _Holder(t.__dlpack__())
    a = np.from_dlpack(holder)
    with pytest.raises(Exception):  # renamed used_dltensor: a second consumer is refused
        np.from_dlpack(holder)
    del holder, a, t
    gc.collect()
    reg.flush()
    with pytest.raises(memcuda.NotFound):
        reg.info("p.cap")  # every share gone: freed


def test_get_many_all_or_nothing(reg):
    keep = [reg.put(f"p.m{i}", np.full(4, i, np.int32)) for i in range(3)]
    got = reg.get_many(["p.m0", "p.m1", "p.m2"])
    assert [int(t.numpy()[0]) for t in got] == [0, 1, 2]
    del got
    gc.collect()
    reg.flush()
    with pytest.raises(memcuda.NotFound):
        reg.get_many(["p.m0", "p.missing"])
    reg.flush()
    assert reg.info("p.m0").refcount == 1
    assert reg.get_many([]) == []
    del keep


def test_batch_calls_give_back_every_reference_on_a_partial_failure(reg):
    """get_many / get_prefix / create_many / put_state_dict are one batch each;
    a refused batch leaves every refcount at its baseline and creates nothing."""
    made = reg.create_many([("b.w", (4, 8), "bf16"), ("b.b", (5,), "f32"), ("b.x", (), "i64")], persistent=True)
    assert [(t.name, t.dtype, t.shape) for t in made] == [("b.w", "bf16", (4, 8)), ("b.b", "f32", (5,)),
                                                          ("b.x", "i64", ())]
    made[1].numpy()[4] = 2.5
    del made
    gc.collect()
    reg.flush()
    base = {n: reg.info(n).refcount for n in ("b.w", "b.b", "b.x")}
    assert base == {"b.w": 1, "b.b": 1, "b.x": 1}  # the names' own references

    got = reg.get_prefix("b.")
    assert list(got) == ["b.b", "b.w", "b.x"] and got["b.b"].numpy()[4] == 2.5
    reg.flush()
    assert reg.info("b.w").refcount == 2
    del got
    gc.collect()
    reg.flush()
    assert {n: reg.info(n).refcount for n in base} == base
    assert reg.get_prefix("b.none.") == {}

    # b.x and b.w are taken by the batch, then given back; the error names the
    # first refused name in the order given.
    with pytest.raises(memcuda.NotFound, match="b.zz"):
        reg.get_many(["b.x", "b.zz", "b.aa", "b.w"])
    reg.flush()
    assert {n: reg.info(n).refcount for n in base} == base

    with pytest.raises(memcuda.AlreadyExists, match="b.x"):
        reg.create_many([("b.new", (2,), "u8"), ("b.x", (2,), "u8")])
    with pytest.raises(memcuda.InvalidArgument):
        reg.create_many([("b.new", (2,), "u8"), ("b.new", (2,), "u8")])
    with pytest.raises(memcuda.AlreadyExists):
        reg.put_state_dict("b.", {"new": np.zeros(2, np.uint8), "x": np.zeros((), np.int64)})
    with pytest.raises(memcuda.NotFound):
        reg.info("b.new")  # all or nothing: nothing created
    with pytest.raises(memcuda.TypeMismatch):
        reg.put_state_dict("b.", {"b": np.zeros(5, np.float32), "w": np.zeros(3, np.float32)}, update=True)
    gc.collect()
    reg.flush()
    assert {n: reg.info(n).refcount for n in base} == base
    assert reg.info("b.b").refcount == 1 and reg.get("b.b").numpy()[4] == 2.5  # nothing written

    twice = reg.get_many(["b.w", "b.w"])
    assert twice[0].data_ptr == twice[1].data_ptr
    del twice
    gc.collect()
    reg.flush()
    assert {n: reg.info(n).refcount for n in base} == base


def test_state_dict_roundtrip_and_in_place_update(reg):
    sd = {"layer.0.w": np.random.rand(4, 4).astype(np.float32), "layer.0.b": np.arange(4, dtype=np.int64),
          "emb": np.ones((2, 3), np.float16)}
    handles = reg.put_state_dict("model/", sd)
    got = reg.get_state_dict("model/", framework="numpy")
    assert sorted(got) == sorted(sd)
    for k in sd:
        assert got[k].dtype == sd[k].dtype and np.array_equal(got[k], sd[k])
    # Weight sync: the producer overwrites in place; a holder sees new values.
    holder = reg.get("model/layer.0.w")
    sd2 = {"layer.0.w": sd["layer.0.w"] + 1}
    reg.put_state_dict("model/", sd2, update=True)
    assert holder.generation == handles["layer.0.w"].generation
    assert np.array_equal(holder.numpy(), sd2["layer.0.w"])
    with pytest.raises(memcuda.TypeMismatch):
        reg.put("model/emb", np.zeros((3, 3), np.float16), update=True)


def test_threads_share_a_registry(reg):
    reg.put("p.th", np.arange(100, dtype=np.float64), persistent=True).release()
    errors = []

    def work():
        try:
            for _ in range(20):
                t = reg.get("p.th")
                assert t.numpy().sum() == 4950
                t.release()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    reg.flush()
    assert reg.info("p.th").refcount == 1


def test_closed_registry_and_released_tensor(reg, redis_url, namespace):
    r2 = memcuda.Registry(redis_url, namespace, control_thread=False)
    t = reg.put("p.cl", np.arange(3, dtype=np.int8))
    u = r2.get("p.cl")
    r2.close()
    assert u.tobytes() == bytes([0, 1, 2])  # tensors outlive their registry
    with pytest.raises(memcuda.InvalidArgument):
        r2.get("p.cl")
    u.release()
    with pytest.raises(memcuda.InvalidArgument):
        u.tobytes()
    assert "released" in repr(u)
    del t


def test_model_versions_wake_a_waiter(reg, redis_url, namespace):
    """publish_version / wait_version: the in-place weight-sync loop."""
    handles = reg.put_state_dict("mv/", {"w": np.zeros(4, np.float32), "b": np.zeros(2, np.float32)})
    consumer = memcuda.Registry(redis_url, namespace, control_thread=False)
    try:
        held = consumer.get_state_dict("mv/", framework="numpy")
        assert consumer.current_version("mv/") == 0
        assert consumer.wait_version("mv/", 0, timeout=0.05) is None

        def train():
            handles["w"].numpy()[:] = 1.5  # in place: the holders' memory
            reg.publish_version("mv/")

        th = threading.Timer(0.2, train)
        th.start()
        assert consumer.wait_version("mv/", 0, timeout=10) == 1
        th.join()
        assert (held["w"] == 1.5).all()
        assert consumer.current_version("mv/") == 1
        assert reg.publish_version("mv/") == 2
        assert consumer.wait_version("mv/", 1, timeout=10) == 2
        with pytest.raises(memcuda.NotFound):
            consumer.current_version("nothing/")
        del held, handles, train, th
        gc.collect()
        consumer.flush()
        reg.flush()
    finally:
        consumer.close()
