"""A Python fleet node for the [nodes] tests (tests/test_nodes.cpp). Run in a
pod of its own with MEMCUDA_FLEET=1 and MEMCUDA_NODE_ID, its registry is the
node's allocator of record through libmemcuda_c, which loads the UCX mover
(libmemcuda_ucx.so) when its first pull needs one. Prints "ready", then
answers one line per command on stdin:
    get NAME SEED        the pattern checked: "ok pulls=P pulled=B"
    open PREFIX SEED     open_model (numpy), every tensor checked: "ok version=V tensors=N"
    check PREFIX SEED    the pinned version checked again: "ok version=V"
    advance PREFIX SEED  advance, then checked: "ok moved=M version=V"
    attach PREFIX SEED N ELEMS  a torch module of N parameters t0.. of ELEMS
                         float32 attached with versions="ab", checked:
                         "ok version=V device=D"
    attach-advance PREFIX SEED  its advance(), then checked: "ok moved=M version=V"
or "error <ExceptionType> <message>". Tensor i of a version of seed S holds
the pattern of seed S + i, element j being (j * 2654435761 + seed) % 1000003
(tests/node_worker.cpp's)."""
import sys

import numpy as np


def pattern(n: int, seed: int) -> np.ndarray:
    i = np.arange(n, dtype=np.uint64)
    return ((i * np.uint64(2654435761) + np.uint64(seed)) % np.uint64(1000003)).astype(np.float32)


def check(name: str, a: np.ndarray, seed: int) -> None:
    want = pattern(a.size, seed)
    if not np.array_equal(a.reshape(-1), want):
        bad = int(np.argmax(a.reshape(-1) != want))
        raise ValueError(f"{name}: pattern mismatch at element {bad}")


def check_model(m, seed: int) -> int:
    names = sorted(m.tensors, key=lambda n: int(n.rsplit("/", 1)[-1].lstrip("t")))  # "t3" or "m/t3"
    for i, n in enumerate(names):
        check(n, np.asarray(m.tensors[n]), seed + i)
    return len(names)


def check_module(mod, seed: int) -> None:
    for i, (n, p) in enumerate(mod.named_parameters()):
        check(n, p.detach().cpu().numpy(), seed + i)


def main() -> int:
    import memcuda
    reg = memcuda.Registry(sys.argv[1])
    held, models, attached = [], {}, {}
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        cmd, name, seed = (words + ["", "", "0"][len(words):])[:3]
        seed = int(seed)
        try:
            if cmd == "get":
                t = reg.get(name)
                check(name, t.numpy(), seed)
                held.append(t)
                st = reg.stats()
                out = f"ok pulls={st.pulls} pulled={st.pulled_bytes}"
            elif cmd == "open":
                m = reg.open_model(name, "numpy")
                models[name] = m
                out = f"ok version={m.version} tensors={check_model(m, seed)}"
            elif cmd in ("check", "advance"):
                m = models[name]
                moved = m.advance() if cmd == "advance" else None
                check_model(m, seed)
                out = ("" if moved is None else f"moved={int(moved)} ") + f"version={m.version}"
                out = "ok " + out
            elif cmd == "attach":
                import torch
                from memcuda.torch import attach
                mod = torch.nn.Module()
                for i in range(int(words[3])):
                    mod.register_parameter(f"t{i}", torch.nn.Parameter(torch.empty(int(words[4])), requires_grad=False))
                att = attach(mod, reg, name, versions="ab")
                attached[name] = (mod, att)
                check_module(mod, seed)
                out = f"ok version={att.version} device={next(mod.parameters()).device.type}"
            elif cmd == "attach-advance":
                mod, att = attached[name]
                moved = att.advance()
                check_module(mod, seed)
                out = f"ok moved={int(moved)} version={att.version}"
            elif cmd == "exit":
                break
            else:
                out = f"error ValueError unknown command {cmd!r}"
        except Exception as e:  # the test reads the line
            out = f"error {type(e).__name__} {e}"
        print(out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
