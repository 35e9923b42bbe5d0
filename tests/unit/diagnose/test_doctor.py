"""The minifier's launcher run by the doctor: in one process first, each candidate in a process of
its own when that leaves no repro (a fake launcher here; tests/integration/test_diagnose.py runs
the real minifier)."""

from __future__ import annotations

from pathlib import Path

from diagnose.doctor import run_minifier

# Writes repro.py as the minifier does at its end, unless it is told to crash with this isolation.
LAUNCHER = """
import os, sys
from pathlib import Path
isolation = sys.argv[2]
with open("runs.txt", "a") as runs:
    runs.write(f"{sys.argv[1]} {isolation}\\n")
print(f"minifying {isolation}")
if isolation == os.environ.get("CRASH_WITH"):
    os.abort()  # a candidate's compile that kills the process
Path("repro.py").write_text("raise AssertionError('Bad accuracy detected')\\n")
"""


def launcher(directory: Path) -> Path:
    path = directory / "minifier_launcher.py"
    path.write_text(LAUNCHER)
    return path


def test_the_minifier_runs_once_in_one_process_when_that_leaves_a_repro(tmp_path):
    said = []
    repro = run_minifier(launcher(tmp_path), tmp_path / "minifier.log", said.append)
    assert repro == tmp_path / "repro.py" and repro.is_file()
    assert (tmp_path / "runs.txt").read_text() == "minify --no-isolate\n"
    assert said == [] and "minifying --no-isolate" in (tmp_path / "minifier.log").read_text()


def test_a_crash_in_one_process_is_minified_again_a_process_per_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASH_WITH", "--no-isolate")
    said = []
    repro = run_minifier(launcher(tmp_path), tmp_path / "minifier.log", said.append)
    assert repro == tmp_path / "repro.py" and repro.is_file()
    assert (tmp_path / "runs.txt").read_text() == "minify --no-isolate\nminify --isolate\n"
    assert said == ["[doctor] minify --no-isolate left no repro.py (exit -6)"]
    log = (tmp_path / "minifier.log").read_text()
    assert "minify --no-isolate" in log and "minifying --isolate" in log  # both attempts' output kept


def test_no_repro_from_either_is_none_with_both_attempts_said(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASH_WITH", "--no-isolate")
    path = launcher(tmp_path)
    path.write_text(path.read_text().replace('Path("repro.py")', 'Path("elsewhere.py")'))
    said = []
    assert run_minifier(path, tmp_path / "minifier.log", said.append) is None
    assert said == [
        "[doctor] minify --no-isolate left no repro.py (exit -6)",
        "[doctor] minify --isolate left no repro.py (exit 0)",
    ]
