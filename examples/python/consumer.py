#!/usr/bin/env python3
"""A PyTorch consumer, started on its own: opens the model tiny/ by name
(zero copy: torch tensors over the producer's memory), checks its values,
then waits for each next version and checks the same tensors again.

    python3 examples/python/consumer.py [--versions 3] [--url redis://...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memcuda  # noqa: E402
import torch  # noqa: E402

import tiny_model  # noqa: E402


def check(sd, version):
    want = tiny_model.expected_state_dict(version)
    bad = [k for k in want if not torch.equal(sd[k].cpu(), want[k])]
    if sorted(sd) != sorted(want) or bad:
        print(f"version {version}: WRONG values in {bad or sorted(set(sd) ^ set(want))}", flush=True)
        return False
    print(f"version {version}: {len(sd)} tensors on {next(iter(sd.values())).device}, "
          f"values as the producer wrote them", flush=True)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None)
    ap.add_argument("--namespace", default=None)
    ap.add_argument("--versions", type=int, default=3, help="stop after this version")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    with memcuda.Registry(args.url, args.namespace, control_thread=False) as reg:
        if not reg.wait(tiny_model.PREFIX + "0.weight", args.timeout):  # the model exists
            print(f"{tiny_model.PREFIX} did not appear within {args.timeout} s", flush=True)
            return 1
        v = reg.wait_version(tiny_model.PREFIX, 0, args.timeout)  # and its first version is out
        sd = reg.get_state_dict(tiny_model.PREFIX, framework="torch")  # one round trip, zero copy
        print(f"opened {tiny_model.PREFIX}: {', '.join(f'{k}{list(t.shape)}' for k, t in sorted(sd.items()))}",
              flush=True)
        ok = check(sd, v)
        while ok and v < args.versions:
            stream = torch.cuda.current_stream() if next(iter(sd.values())).is_cuda else None
            nv = reg.wait_version(tiny_model.PREFIX, v, args.timeout, stream=stream)
            if nv is None:
                print(f"no version after {v} within {args.timeout} s", flush=True)
                return 1
            v = nv
            ok = check(sd, v)  # the same tensors: updated in place
        del sd
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
