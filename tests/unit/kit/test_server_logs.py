"""kit/server_logs.py: what a run directory's logs say, read from the last start on."""

from __future__ import annotations

from kit.server_logs import OomWatch, RunLogs


def test_load_failures_and_exit_reason_see_only_what_this_run_wrote(tmp_path):
    logs = RunLogs(tmp_path)
    logs.model_log.write_text("2026 Failed to load model old: an earlier run\n")
    logs.output_file.write_text("Error: an earlier run's exit\n")
    logs.mark()
    assert logs.load_failures() == [] and logs.exit_reason() == "no output"
    with open(logs.model_log, "a") as log:
        log.write("INFO loading\n2026 Failed to load model bert: index out of range\n")
    with open(logs.output_file, "a") as output:
        output.write("starting\nUnrecognized VM option 'UseFoo'\nError: Could not create the Java Virtual Machine.\n")
    assert logs.load_failures() == ["2026 Failed to load model bert: index out of range"]
    assert logs.exit_reason() == "Unrecognized VM option 'UseFoo'"  # the first line that says why
    assert logs.tail(logs.model_log, lines=1) == "2026 Failed to load model bert: index out of range"


def test_a_rolled_over_log_is_read_from_its_start(tmp_path):
    logs = RunLogs(tmp_path)
    logs.frontend_log.write_text("x" * 1000 + "\n")
    logs.mark()
    logs.frontend_log.write_text("Load model failed: bert\n")  # shorter than the mark: a new file
    assert logs.load_failures() == ["Load model failed: bert"]


def test_no_oom_note_without_a_cgroup_or_new_kills():
    assert OomWatch().note() == ""
    assert OomWatch("0::/kit-test-no-such-cgroup\n", 3).note() == ""  # unknown count now: no claim
