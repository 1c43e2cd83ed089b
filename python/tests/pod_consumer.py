"""A PyTorch consumer for the container tests (tests/test_pods.cpp): run in a
pod of its own, it opens a tensor by name through the shared Redis socket and
runtime directory, reads it with torch and prints one line,
"OK sum=<sum> device=<torch device> same_memory=<True|False>", or
"ERR <exception>"."""
import sys


def main() -> int:
    url, runtime_dir, name = sys.argv[1:4]
    try:
        import memcuda
        with memcuda.Registry(url, control_thread=False, runtime_dir=runtime_dir) as reg:
            t = reg.get(name)
            x = t.torch()
            total = float(x.double().sum().item())
            print(f"OK sum={total:.0f} device={x.device} same_memory={x.data_ptr() == t.data_ptr}", flush=True)
            del x
            t.release()
    except Exception as e:  # the test reads the line; the reason is the point
        print(f"ERR {type(e).__name__}: {e}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
