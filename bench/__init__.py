"""Benchmarks run by `make bench`; each module with a main() is one benchmark."""
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
