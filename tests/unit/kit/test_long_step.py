"""kit/long_step.py on real commands: the output's lines back, the time said; a failure's exit
code and log end in the error."""

import pytest

from kit import long_step


def test_a_step_returns_its_lines_and_says_its_time(tmp_path):
    said = []
    lines = long_step.run(["sh", "-c", "echo one; echo two >&2"], "counting", tmp_path / "count.log", said.append)
    assert lines == ["one", "two"]
    assert said[0] == f"counting (log: {tmp_path / 'count.log'})" and said[1].startswith("counting: done in ")


def test_a_failed_step_carries_its_exit_code_and_the_logs_end(tmp_path):
    command = ["sh", "-c", "for i in $(seq 1 20); do echo line $i; done; exit 3"]
    with pytest.raises(
        long_step.StepFailed, match=r"counting failed \(exit 3\); the end of .*count.log:\nline 6\n"
    ) as failed:
        long_step.run(command, "counting", tmp_path / "count.log", lambda message: None)
    assert failed.value.returncode == 3 and failed.value.last_line == "line 20"
    assert "line 5\n" not in str(failed.value)  # the last 15 lines, not the whole log
