"""Runs every benchmark that exists, so `make bench` works while parts of the node are still unwritten;
`python -m bench cri cni` runs only the ones named."""
import importlib
import sys

MODULES = ("bench.runtime", "bench.cni", "bench.images", "bench.cri", "bench.kubelet", "bench.cluster")


def main(names: list[str]) -> int:
    status = 0
    for name in (f"bench.{n}" for n in names) if names else MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            print(f"== {name}: not present, skipped\n")
            continue
        print(f"== {name}")
        status |= module.main() or 0
        print()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
