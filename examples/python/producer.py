#!/usr/bin/env python3
"""A PyTorch producer: publishes a small model's state dict under a name
(tiny/), publishes version 1, waits for a consumer, then trains in place and
publishes versions 2..N (the weight-sync loop: the consumers' tensors see the
new values, nothing is re-opened).

    python3 examples/python/producer.py [--versions 3] [--device cuda|cpu] [--url redis://...]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memcuda  # noqa: E402
import torch  # noqa: E402

import tiny_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="Redis (default: $MEMCUDA_REDIS_URL, else redis://127.0.0.1:6379)")
    ap.add_argument("--namespace", default=None)
    ap.add_argument("--device", default=tiny_model.default_device())
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between versions")
    ap.add_argument("--timeout", type=float, default=60, help="seconds to wait for a consumer")
    args = ap.parse_args()
    backend = "cuda" if args.device.startswith("cuda") else "host"
    with memcuda.Registry(args.url, args.namespace, default_backend=backend) as reg:
        model = tiny_model.make(args.device)
        shared = reg.put_state_dict(tiny_model.PREFIX, model.state_dict())  # one create_many
        total = sum(t.nbytes for t in shared.values())
        print(f"published {tiny_model.PREFIX} ({len(shared)} tensors, {total} bytes, {backend} backend)", flush=True)
        v = reg.publish_version(tiny_model.PREFIX)
        print(f"version {v}", flush=True)

        # A consumer holding the model shows up as a second holder.
        first = tiny_model.PREFIX + "0.weight"
        deadline = time.monotonic() + args.timeout
        while reg.info(first).holders < 2:
            if time.monotonic() > deadline:
                print(f"no consumer opened {tiny_model.PREFIX} within {args.timeout} s", file=sys.stderr)
                return 1
            time.sleep(0.05)
        print("a consumer holds the model", flush=True)

        stream = torch.cuda.current_stream() if backend == "cuda" else None
        for _ in range(args.versions - 1):
            time.sleep(args.interval)
            tiny_model.train_step(model)
            # Copies into the shared tensors in place (every holder sees them),
            # then one event and one version for the whole model.
            reg.put_state_dict(tiny_model.PREFIX, model.state_dict(), update=True, stream=stream)
            v = reg.publish_version(tiny_model.PREFIX, stream=stream)
            print(f"version {v}", flush=True)

        # Keep the model alive until the consumer let it go.
        while reg.info(first).holders > 1 and time.monotonic() < deadline + args.timeout:
            time.sleep(0.05)
        print("the consumer is done; exiting", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
