"""bench/generate/run.py's report: each kit row against each peer's row at the same precision, a
column per peer the run had."""

from __future__ import annotations

import statistics

from bench.generate.run import report
from bench.generate.systems import KIT, System


def stats(*by_round: float) -> dict:
    def spread(*values: float) -> dict:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "output_tokens_per_s": spread(*by_round),
        "output_tokens_per_s_by_round": list(by_round),
        "ttft_ms_p50": spread(100),
        "ttft_ms_p99": spread(200),
        "itl_ms_p50": spread(50),
        "itl_ms_p99": spread(90),
        "peak_pss_gb": spread(3.25),
        "largest_process_pss_gb": spread(3.0),
        "requests": 4,
        "errors": 0,
    }


def system(name: str, server: str, precision: str) -> System:
    return System(name, server, precision, "http://unused", lambda: None, "lm")


def test_a_kit_row_is_divided_by_the_peers_rows_at_its_own_precision(tmp_path):
    systems = {
        s.name: s
        for s in (
            system("kit inductor", KIT, "float32"),
            system("kit inductor-bf16", KIT, "bfloat16"),
            system("kit inductor-bf16-woq", KIT, "int8"),
            system("fastapi float32", "fastapi", "float32"),
            system("fastapi bfloat16", "fastapi", "bfloat16"),
            system("llama.cpp bf16", "llama.cpp", "bfloat16"),
            system("llama.cpp q8_0", "llama.cpp", "int8"),
            system("openvino float32", "openvino", "float32"),
        )
    }
    rows = {
        "kit inductor": stats(10),
        "kit inductor-bf16": stats(30),
        "kit inductor-bf16-woq": stats(20),
        "fastapi float32": stats(5),
        "fastapi bfloat16": stats(10),
        "llama.cpp bf16": stats(20),
        "llama.cpp q8_0": stats(40),
        "openvino float32": stats(8),
    }
    text = report({16: rows}, systems, tmp_path, "# header")
    assert "× FastAPI, by round (min–max) | × llama.cpp, by round (min–max) | × OpenVINO GenAI" in text
    lines = {line.split(" | ")[1]: line.split(" | ") for line in text.splitlines() if line.startswith("| 16 |")}
    assert lines["kit inductor"][3:6] == ["2.00× (2.00–2.00)", "", "1.25× (1.25–1.25)"]  # no llama.cpp f32 row
    assert lines["kit inductor-bf16"][3:6] == ["3.00× (3.00–3.00)", "1.50× (1.50–1.50)", ""]
    assert lines["kit inductor-bf16-woq"][3:6] == ["", "0.50× (0.50–0.50)", ""]  # int8 weights: llama.cpp's Q8_0
    assert lines["llama.cpp bf16"][3:6] == lines["fastapi float32"][3:6] == ["", "", ""]  # peers are not divided
    assert "| peak PSS GB | largest process GB |" in text  # every row's memory, and its largest process's
    assert lines["kit inductor"][10:12] == ["3.25", "3.00"]
    assert lines["kit inductor"][9] == ""  # no drafts: the column is empty
    assert (tmp_path / "report.md").read_text() == text


def test_each_row_at_the_most_clients_is_set_against_itself_at_the_fewest(tmp_path):
    systems = {
        s.name: s for s in (system("kit inductor", KIT, "float32"), system("llama.cpp f32", "llama.cpp", "float32"))
    }
    one, many = stats(10), stats(60)
    many["ttft_ms_p50"], many["itl_ms_p50"], many["itl_ms_p99"] = {"median": 400}, {"median": 80}, {"median": 200}
    results = {1: {"kit inductor": one, "llama.cpp f32": stats(10)}, 16: {"kit inductor": many}}
    text = report(results, systems, tmp_path, "# header")
    assert "| row | 16 clients against 1: output tokens/s | TTFT p50 | at 16: ITL p99 ÷ ITL p50 |" in text
    # 60 against 10 tokens/s, TTFT 400 against 100 ms, ITL p99 200 against p50 80; a row missing
    # at 16 clients (an interrupted run) has no line.
    assert "| kit inductor | 6.00× | 4.00× | 2.50× |" in text
    assert "| llama.cpp f32 | " not in text.split("clients against")[1]


def test_a_row_that_wrote_nothing_at_the_fewest_clients_has_no_ratios(tmp_path):
    systems = {"kit inductor": system("kit inductor", KIT, "float32")}
    text = report({1: {"kit inductor": stats(0)}, 16: {"kit inductor": stats(60)}}, systems, tmp_path, "# header")
    assert "| kit inductor | – | – | – |" in text


def test_one_concurrency_has_no_scaling_table(tmp_path):
    systems = {"kit inductor": system("kit inductor", KIT, "float32")}
    assert "clients against" not in report({4: {"kit inductor": stats(10)}}, systems, tmp_path, "# header")


def test_a_ratio_is_taken_round_by_round_not_between_medians(tmp_path):
    systems = {
        s.name: s for s in (system("kit inductor", KIT, "float32"), system("llama.cpp f32", "llama.cpp", "float32"))
    }
    # Medians 30 and 20 (1.5×); round by round the kit wrote 4×, 0.75× and 0.5× the peer's tokens/s.
    rows = {"kit inductor": stats(40, 30, 10), "llama.cpp f32": stats(10, 40, 20)}
    text = report({4: rows}, systems, tmp_path, "# header")
    (kit,) = [line.split(" | ") for line in text.splitlines() if line.startswith("| 4 | kit")]
    assert kit[3] == "0.75× (0.50–4.00)"  # the one peer's column


def test_the_generate_plan_is_a_file_the_bench_reads_its_command_line_over_it(monkeypatch):
    import bench.__main__ as bench_main

    calls = []
    monkeypatch.setattr(bench_main.generate, "main", lambda argv: calls.append(argv) or 0)
    assert bench_main.main(["--plan", "generate", "--models", "lm", "--peers", "none", "--seconds", "30"]) == 0
    (argv,) = calls
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    # bench/plans/generate.yaml's rounds, concurrency and backends; the command line's peers and seconds.
    assert options == {
        "--model": "lm",
        "--rounds": "3",
        "--seconds": "30",
        "--concurrency": "1,4,16",
        "--peers": "none",
        "--backends": "inductor",
    }


def test_a_serving_plan_refuses_a_generate_plans_settings_by_name(capsys):
    import bench.__main__ as bench_main

    assert bench_main.main(["--plan", "quick", "--rounds", "2"]) == 2
    assert "--rounds set a generate plan's settings; plan 'quick' is a serving plan" in capsys.readouterr().err
    assert bench_main.main(["--plan", "generate"]) == 2
    assert "give MODELS=lm" in capsys.readouterr().err


def test_a_row_with_prompt_lookup_says_the_share_of_drafted_tokens_kept(tmp_path):
    systems = {"kit inductor copy": system("kit inductor copy", KIT, "float32")}
    text = report({1: {"kit inductor copy": {**stats(10), "drafts_kept": 0.625}}}, systems, tmp_path, "# header")
    assert "| drafts kept |" in text and text.splitlines()[-1].split(" | ")[6] == "62%"
