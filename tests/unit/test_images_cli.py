from __future__ import annotations

import io
from pathlib import Path

from pyruntime.cli.image import _ProgressBar, main
from pyruntime.images.archive import ArchiveImage, import_names
from pyruntime.images.pull import ProgressEvent


def test_progress_lines_without_a_terminal() -> None:
    out = io.StringIO()
    bar = _ProgressBar(out)
    bar(ProgressEvent("r", "sha256:" + "ab" * 32, "downloading", 50, 100))
    bar(ProgressEvent("r", "sha256:" + "ab" * 32, "done", 100, 100))
    assert out.getvalue() == "abababababab: done\n"


def test_import_names() -> None:
    def names(found: list[str], name: str | None) -> list[str]:
        return import_names(ArchiveImage(b"", "", found, {}), name)
    assert names(["latest"], None) == []
    assert names(["latest"], "example.com/app") == ["example.com/app:latest"]
    assert names(["busybox:1.0"], None) == ["docker.io/library/busybox:1.0"]
    assert names(["docker.io/library/busybox:latest"], "x") == ["docker.io/library/busybox:latest"]
    assert names([], "example.com/app:v1") == ["example.com/app:v1"]


def test_errors_are_one_line_with_the_culprit(tmp_path: Path, capsys) -> None:
    assert main(["--root", str(tmp_path), "inspect", "sha256:" + "0" * 64]) == 1
    assert "0" * 64 in capsys.readouterr().err
    assert main(["--root", str(tmp_path), "pull", "Not/Valid"]) == 1
    assert "'Not/Valid'" in capsys.readouterr().err
    assert main(["--root", str(tmp_path), "list"]) == 0
