"""bench/ab.py: ab's output parsed, and the argv that runs it."""

from __future__ import annotations

import pytest

from bench.ab import AbParseError, ab_command, parse_ab

AB_OUTPUT = """\
Server Software:
Server Hostname:        127.0.0.1
Server Port:            8080

Document Path:          /predictions/resnet50
Document Length:        151 bytes

Concurrency Level:      4
Time taken for tests:   20.004 seconds
Complete requests:      482
Failed requests:        37
   (Connect: 0, Receive: 0, Length: 37, Exceptions: 0)
Non-2xx responses:      3
Keep-Alive requests:    482
Total transferred:      139021 bytes
Total body sent:        47127284
HTML transferred:       72589 bytes
Requests per second:    24.10 [#/sec] (mean)
Time per request:       166.009 [ms] (mean)
Time per request:       41.502 [ms] (mean, across all concurrent requests)
Transfer rate:          6.79 [Kbytes/sec] received

Percentage of the requests served within a certain time (ms)
  50%    162
  66%    170
  75%    176
  80%    181
  90%    196
  95%    209
  98%    221
  99%    228
 100%    265 (longest request)
"""


def test_parse_ab_reads_every_field():
    result = parse_ab(AB_OUTPUT)
    assert result.complete == 482
    assert result.failed == 0  # 37 "Length" failures are varying JSON sizes, not errors
    assert result.non_2xx == 3
    assert result.requests_per_s == 24.10
    assert result.mean_ms == 166.009
    assert (result.p50_ms, result.p90_ms, result.p99_ms, result.max_ms) == (162, 196, 228, 265)
    assert result.duration_s == 20.004


def test_parse_ab_counts_real_failures_and_missing_non2xx():
    text = AB_OUTPUT.replace(
        "(Connect: 0, Receive: 0, Length: 37, Exceptions: 0)", "(Connect: 2, Receive: 1, Length: 5, Exceptions: 4)"
    )
    text = text.replace("Non-2xx responses:      3\n", "")
    result = parse_ab(text)
    assert result.failed == 7
    assert result.non_2xx == 0


def test_parse_ab_names_a_missing_field():
    with pytest.raises(AbParseError, match="'Requests per second'"):
        parse_ab(AB_OUTPUT.replace("Requests per second", "Requests/s"))


def test_ab_command_is_an_argv_with_keepalive(tmp_path):
    argv = ab_command(
        "http://127.0.0.1:1/predictions/bert",
        tmp_path / "s.txt",
        "text/plain",
        seconds=20,
        concurrency=4,
        headers={"Authorization": "Bearer k"},
    )
    assert argv[:2] == ["ab", "-k"]
    assert argv[argv.index("-t") + 1] == "20" and argv[argv.index("-c") + 1] == "4"
    assert argv.index("-n") > argv.index("-t")  # -t would otherwise cap -n at 50000
    assert argv[argv.index("-H") : argv.index("-H") + 2] == ["-H", "Authorization: Bearer k"]
    assert argv[-1] == "http://127.0.0.1:1/predictions/bert"
