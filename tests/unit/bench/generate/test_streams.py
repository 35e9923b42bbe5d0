"""bench/generate/streams.py against a real HTTP server that streams OpenAI completion events at a known pace."""

from __future__ import annotations

import ctypes
import http.server
import json
import threading
import time

import pytest

from bench.generate.streams import Ask, Record, Spread, StreamStats, Window, measure_streams, window_stats

# Far apart: the bounds below tell the first chunk from the second, and one gap from two.
TOKENS, GAP_S, FIRST_S = 5, 0.1, 0.2
STALL_S = 2.0  # what a busy machine may add to a wait (see test_first_token_gaps_and_tokens_are_measured_per_stream)


class Completions(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    prompts: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        chat = self.path.endswith("/chat/completions")
        if chat:  # a structured-output ask: the grammar ends it, so no ignore_eos
            assert body["response_format"]["json_schema"]["schema"]["type"] == "string" and "ignore_eos" not in body
            body = {**body, "prompt": body["messages"][0]["content"], "ignore_eos": True}
        self.prompts.append(body["prompt"])
        if body["prompt"].endswith("garbled"):  # a 200 whose event is not JSON
            data = b"data: {not json\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if body["prompt"].endswith("bad"):
            self.send_response(400)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        assert body["stream"] and body["ignore_eos"] and body["stream_options"] == {"include_usage": True}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(FIRST_S)
        piece = (lambda i: {"delta": {"content": f"t{i}"}}) if chat else (lambda i: {"text": f"t{i}"})
        usage = {"completion_tokens": TOKENS}
        if body["prompt"].endswith("copy"):  # a server that drafted: 3 of its 4 drafted tokens kept
            usage["completion_tokens_details"] = {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1}
        events = [{"choices": [piece(i)]} for i in range(TOKENS)] + [{"choices": [], "usage": usage}]
        for index, event in enumerate(events):
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            if index < TOKENS - 1:
                time.sleep(GAP_S)
        done = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


@pytest.fixture(scope="module")
def url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    server.shutdown()


def test_first_token_gaps_and_tokens_are_measured_per_stream(url):
    stats = measure_streams(url, "m", [Ask("hello", TOKENS)], concurrency=2, seconds=0.8)
    assert stats.requests >= 2 and stats.errors == 0
    # Each client's last request was sent before the window closed and streams past it: its tokens
    # after the close are not the server's at two streams, and are not counted.
    assert 0 < stats.output_tokens < TOKENS * stats.requests
    # At least the server's own waits. At most those plus STALL_S: a loaded 2-CPU machine (CI
    # installs .venv-ipex beside the unit tests) once held both streams' first tokens 1 s longer.
    assert FIRST_S * 1000 <= stats.ttft_ms.p50 < (FIRST_S + STALL_S) * 1000
    assert GAP_S * 1000 <= stats.itl_ms.p50 < (GAP_S + STALL_S) * 1000
    assert stats.output_tokens_per_s == pytest.approx(stats.output_tokens / stats.seconds)


def test_the_window_opens_once_every_client_has_had_its_first_answer_begin():
    window = Window(clients=2, seconds=5.0)
    window.begun(0)
    window.begun(0)  # a client's later requests change nothing
    assert window.opened is None and window.closes == float("inf")
    before = time.perf_counter()
    window.begun(1)
    assert window.opened is not None and before <= window.opened <= time.perf_counter()
    assert window.closes == window.opened + 5.0


def test_a_window_counts_the_tokens_and_gaps_that_arrived_in_it_and_first_tokens_of_requests_sent_in_it():
    records = [
        Record(started=0.0, chunks=[1.0, 2.0, 3.0, 4.0], tokens=8),  # the burst: two chunks in, 2 tokens each
        Record(started=3.0, chunks=[3.5, 9.0, 11.0, 12.0], tokens=4),  # the tail: two chunks after the close
        Record(started=5.0, error="503: busy"),
    ]
    stats = window_stats(records, concurrency=2, opened=2.5, closed=10.0)
    assert stats.seconds == 7.5 and stats.output_tokens == 4 + 2
    assert stats.output_tokens_per_s == pytest.approx(6 / 7.5)
    assert stats.ttft_ms == Spread(500.0, 500.0)  # the request sent at 3.0 only
    assert stats.itl_ms == Spread(1000.0, 5500.0)  # 2->3, 3->4 and 3.5->9; 9->11 ended after the close
    assert (stats.requests, stats.errors, stats.first_error) == (2, 1, "503: busy")


def test_a_refused_request_is_an_error_not_a_measurement(url):
    stats = measure_streams(url, "m", [Ask("bad", TOKENS)], concurrency=1, seconds=0.2)
    assert stats.requests == 0 and stats.errors >= 1 and stats.output_tokens == 0
    assert stats.first_error == "400: {}"


def test_an_event_that_is_not_json_is_that_requests_error_and_the_window_still_opens(url):
    stats = measure_streams(url, "m", [Ask("garbled", TOKENS)], concurrency=1, seconds=0.2)
    assert stats.requests == 0 and stats.errors >= 1 and "Expecting property name" in stats.first_error


def test_no_two_requests_of_a_run_send_the_same_prompt_and_each_ends_with_the_workloads(url):
    Completions.prompts.clear()
    for _ in range(2):  # a row measured again (the next round) sends new prompts too
        measure_streams(url, "m", [Ask("one", 1), Ask("two", 1)], concurrency=2, seconds=0.8)
    assert len(Completions.prompts) >= 8  # each client sent at least twice per row, and both asks went out
    assert len(set(Completions.prompts)) == len(Completions.prompts)
    assert {prompt.split(" ", 1)[1] for prompt in Completions.prompts} == {"one", "two"}


def test_a_measurement_says_in_one_line_what_it_gave_and_why_requests_failed():
    ok = StreamStats(4, 10.0, 8, 125, Spread(210.4, 400.0), Spread(49.6, 90.0), 0)
    assert ok.summary() == "12.5 tokens/s, TTFT p50 210 ms, ITL p50 50 ms, 0 errors"
    failed = StreamStats(4, 10.0, 8, 125, Spread(210.4, 400.0), Spread(49.6, 90.0), 2, "503: " + "x" * 300)
    assert failed.summary().endswith(f"2 errors (the first: 503: {'x' * 195})")


def test_a_schema_ask_goes_to_chat_with_its_response_format_and_is_measured_alike(url):
    stats = measure_streams(url, "m", [Ask("hello", TOKENS, {"type": "string"})], concurrency=1, seconds=0.5)
    assert stats.errors == 0 and stats.requests >= 1 and stats.output_tokens > 0
    assert GAP_S * 1000 <= stats.itl_ms.p50 < (GAP_S + STALL_S) * 1000


def test_the_drafted_tokens_kept_and_refused_are_what_the_usage_said(url):
    stats = measure_streams(url, "m", [Ask("copy", TOKENS)], concurrency=1, seconds=0.5)
    assert (stats.drafts_kept, stats.drafts_refused) == (3 * stats.requests, stats.requests)
    assert stats.drafts_kept_share == 0.75 and stats.summary().endswith(
        f"75% of {4 * stats.requests} drafted tokens kept"
    )
    plain = measure_streams(url, "m", [Ask("hello", TOKENS)], concurrency=1, seconds=0.3)
    assert plain.drafts_kept_share is None and "drafted" not in plain.summary()


def interrupt(thread_id: int) -> None:
    """Ctrl-C as the thread running measure_streams sees it, whichever thread it is (pytest-xdist
    runs tests outside the main thread, where no signal goes): a KeyboardInterrupt raised in it."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(KeyboardInterrupt))


def test_ctrl_c_ends_the_measurement_and_no_client_asks_again(url):
    """An interrupt while the clients stream (the measuring thread waiting for them): it goes up
    to the bench (which stops its servers) at once, and no client sends a request after it."""
    Completions.prompts.clear()
    threading.Timer(FIRST_S / 2, interrupt, (threading.get_ident(),)).start()  # the first requests streaming
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        measure_streams(url, "m", [Ask("hello", TOKENS)], concurrency=2, seconds=30)
    assert time.perf_counter() - started < STALL_S  # not at the end of the streams in flight, nor the deadline's
    sent = len(Completions.prompts)
    time.sleep(FIRST_S + TOKENS * GAP_S + 0.5)  # the streams in flight end; a client would ask again
    assert sent == len(Completions.prompts) == 2
