import sys


def main() -> int:
    print("pyruntime: not yet", file=sys.stderr)
    return 1
