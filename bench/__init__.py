"""Benchmarks run by `make bench`; each module with a main() is one benchmark."""
import os
import signal
import sys
from pathlib import Path

README = Path(__file__).with_name("README.md")


def record_section(begin: str, end: str, body: str, readme: Path = README) -> None:
    """`body` between the markers `begin` and `end` of `readme` (appended with them when missing), so a
    benchmark rewrites its own figures and nothing else."""
    text = readme.read_text() if readme.exists() else ""
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    readme.write_text(text)


def start_as_root(name: str) -> bool:
    """For a benchmark that makes kernel objects: a SIGTERM (a timeout, a CI cancel) unwinds like ^C, so its
    clean-up runs and nothing is left; False, said on stderr, when not root."""
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    if os.geteuid() != 0:
        print(f"{name}: needs root", file=sys.stderr)
        return False
    return True
