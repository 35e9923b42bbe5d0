"""bench/results.py's study_report: the table under a header naming the command, the commit and
the CPU, in report.md; the environment and the records in results.json."""

from __future__ import annotations

import dataclasses
import json

from bench.results import RunEnvironment, study_report


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    ms: float


def test_a_study_writes_its_table_under_the_command_commit_and_cpu(tmp_path, capsys):
    rows = [Row("a", 1.5), Row("b", 2.0)]
    text = study_report(tmp_path, "A study", "2 rounds", lambda header: f"{header}\n\n| a | 1.5 |\n", {"rows": rows})
    environment = RunEnvironment.capture()
    first, _, command = text.splitlines()[:3]
    assert first == "# A study"
    assert f"at {environment.git_commit}; 2 rounds; CPU: {environment.cpu_model}" in command
    assert (tmp_path / "report.md").read_text() == text and text in capsys.readouterr().out
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["rows"] == [{"name": "a", "ms": 1.5}, {"name": "b", "ms": 2.0}]
    assert document["environment"]["cpu_model"] == environment.cpu_model
