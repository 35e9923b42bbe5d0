"""handlers/worker.py against TorchServe 0.12's own worker code: the same frames parsed and answered,
without the per-request log and metric lines, over a real socket pair."""

from __future__ import annotations

import logging
import socket
import struct
import threading

import pytest
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.protocol import otf_message_handler as otf
from ts.service import Service

from handlers.outside_context import METRICS_CONFIG
from handlers.stages import Stage, StageClock
from handlers.streaming import StreamingHandler
from handlers.worker import BufferedConnection, KitWorker, predict, stage_clock


def field(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def request_frame(requests: list[tuple[str, dict[str, str], bytes, str]]) -> bytes:
    """An inference frame as the frontend encodes it (ts/protocol/otf_message_handler.py reads it)."""
    frame = bytearray(otf.PREDICT_MSG)
    for request_id, headers, body, content_type in requests:
        frame += field(request_id.encode())
        for name, value in headers.items():
            frame += field(name.encode()) + field(value.encode())
        frame += struct.pack("!i", -1)
        frame += field(b"body") + field(content_type.encode()) + field(body)
        frame += struct.pack("!i", -1)
    return bytes(frame + struct.pack("!i", -1))


REQUESTS = [
    ("id-1", {"Host": "127.0.0.1:8080", "Content-Length": "70000"}, bytes(range(256)) * 280, "image/jpeg"),
    ("id-2", {"Content-Type": "text/plain"}, b"a short text", "text/plain"),
]


def parsed_over_a_socket(frame: bytes, wrap) -> list:
    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=left.sendall, args=(frame,))
        sender.start()
        connection = wrap(right)
        assert otf._retrieve_buffer(connection, 1) == otf.PREDICT_MSG
        batch = otf._retrieve_inference_msg(connection)
        sender.join()
    return batch


def test_a_buffered_frame_parses_as_torchserve_parses_it_from_the_socket():
    frame = request_frame(REQUESTS)
    ours = parsed_over_a_socket(frame, BufferedConnection)
    theirs = parsed_over_a_socket(frame, lambda sock: sock)  # TorchServe: one recv() per field
    assert ours == theirs
    assert [r["parameters"][0]["value"] for r in ours] == [REQUESTS[0][2], "a short text"]


def test_a_closed_connection_ends_the_worker_as_torchserve_does():
    left, right = socket.socketpair()
    left.close()
    with right, pytest.raises(SystemExit):
        otf._retrieve_buffer(BufferedConnection(right), 1)


class EchoHandler:
    """A handler whose clock the worker finds (stage_clock) and whose answers are the bodies' sizes."""

    def __init__(self):
        self.stages = StageClock("echo", None)

    def handle(self, inputs, context):
        for index in range(len(inputs)):
            context.set_response_content_type(index, "application/json")
        return [{"bytes": len(item["body"])} for item in inputs]


def service_of(entry_point) -> Service:
    metrics = MetricsCacheYamlImpl(str(METRICS_CONFIG))
    metrics.initialize_cache()
    service = Service("echo", "/tmp", None, entry_point, None, 4, metrics_cache=metrics)
    service.set_cl_socket(None)
    return service


def batch_of() -> list:
    return parsed_over_a_socket(request_frame(REQUESTS), BufferedConnection)


def test_the_answer_frame_is_torchserves_without_its_prediction_metric_line(caplog):
    handler = EchoHandler()
    service = service_of(handler.handle)
    with caplog.at_level(logging.INFO):
        theirs = service.predict(batch_of())
    assert any("[METRICS]PredictionTime" in r.getMessage() for r in caplog.records)
    caplog.clear()
    service = service_of(handler.handle)  # a fresh context: response headers are per call
    with caplog.at_level(logging.INFO):
        ours = predict(service, batch_of())
    assert ours == theirs
    assert not [r.getMessage() for r in caplog.records]
    assert stage_clock(service) is handler.stages


def test_a_failing_handler_gets_torchserves_503_and_the_worker_goes_on(caplog):
    def broken(inputs, context):
        raise RuntimeError("boom")

    frame = predict(service_of(broken), batch_of())
    assert struct.unpack("!i", frame[:4])[0] == 503 and b"Prediction failed" in frame
    assert stage_clock(service_of(broken)) is None  # a plain function: served untimed


def test_a_handler_answering_too_few_rows_is_a_503():
    frame = predict(service_of(lambda inputs, context: [1]), batch_of())
    assert struct.unpack("!i", frame[:4])[0] == 503 and b"number of batch response mismatched" in frame


def load_frame() -> bytes:
    """A load frame as the frontend sends it (otf._retrieve_load_msg)."""
    return (
        otf.LOAD_MSG
        + field(b"echo")
        + field(b"/tmp")
        + struct.pack("!i", 4)
        + field(b"echo.py")
        + struct.pack("!i", -1)
        + field(b"")
        + struct.pack("!?", True)
    )


def read_answer(sock: socket.socket) -> bytes:
    """One answer frame (create_predict_response's layout, no response headers here) read whole."""
    data = b""
    while not data.endswith(struct.pack("!i", -1)) or len(data) < 12:
        data += sock.recv(65536)
    return data


def test_the_loop_loads_answers_and_times_the_frame_stages():
    handler = EchoHandler()

    class LoadedWorker(KitWorker):
        def load_model(self, request):
            assert request["modelName"] == b"echo"
            return service_of(handler.handle), "loaded", 200

    frontend, worker_end = socket.socketpair()
    worker = LoadedWorker.__new__(LoadedWorker)  # no listening socket: the pair is the connection
    loop = threading.Thread(target=lambda: pytest.raises(SystemExit, worker.handle_connection, worker_end))
    loop.start()
    with frontend:
        frontend.sendall(load_frame())
        assert struct.unpack("!i", read_answer(frontend)[:4])[0] == 200
        for _ in range(3):
            frontend.sendall(request_frame(REQUESTS))
            answer = read_answer(frontend)
            assert struct.unpack("!i", answer[:4])[0] == 200 and b'"bytes": 71680' in answer
    loop.join(timeout=10)  # the frontend went away: the loop exits, as TorchServe's does
    assert not loop.is_alive()
    worker_end.close()
    for stage in (Stage.READ, Stage.WRITE):
        assert (handler.stages.histograms[stage].calls, handler.stages.histograms[stage].requests) == (3, 6)
    assert handler.stages.histograms[Stage.WAIT].calls == 2  # between calls, not before the first


class AcceptingHandler(StreamingHandler):
    """A language model's handler: answers each request later, from a thread of its own."""

    def initialize(self, context):
        raise AssertionError("the tests load it themselves")

    def __init__(self, more: bool = False):
        # An open answer ("true" piece), written before accept returns (so a test knows which
        # answer holds it); else the whole answer ("false"), from a thread of the handler's own.
        self.more = more
        self.accepted: list[tuple[str, dict]] = []
        self.cancelled: list[str] = []
        self.replies = None
        self.serving: threading.Thread | None = None
        self.stopped = threading.Event()

    def handle(self, data, context):
        raise AssertionError("a language model's handler is never called per batch")

    def connect(self, replies):
        self.replies = replies

    def accept(self, request_id, request, headers):
        self.accepted.append((request_id, headers))
        if headers.get("Content-Type") == "text/plain":
            raise RuntimeError("a handler bug")
        body = bytes(request["body"])
        if self.more:
            self.replies.send(request_id, body[:5], "text/plain", more=True)
            return
        threading.Thread(
            target=self.replies.send, args=(request_id, body[:5], "text/plain"), kwargs={"more": False}
        ).start()

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def serve(self):
        """The engine's loop, on the worker's main thread, until stop()."""
        self.serving = threading.current_thread()
        self.stopped.wait(timeout=30)

    def stop(self):
        self.stopped.set()


def test_the_async_loop_hands_requests_over_as_they_come_and_a_failing_one_gets_a_503():
    handler = AcceptingHandler()

    class LoadedWorker(KitWorker):
        def load_model(self, request):
            return service_of(handler.handle), "loaded", 200

    frontend, worker_end = socket.socketpair()
    worker = LoadedWorker.__new__(LoadedWorker)
    worker.async_comm = True
    loop = threading.Thread(target=lambda: pytest.raises(SystemExit, worker.handle_connection, worker_end))
    loop.start()
    with frontend:
        frontend.sendall(load_frame())
        assert struct.unpack("!i", read_answer(frontend)[:4])[0] == 200
        frontend.sendall(request_frame(REQUESTS))
        frontend.settimeout(30)
        answers = b""
        while answers.count(b"ts_stream_next") < 2:  # id-1's answer, and id-2's release after its 503
            answers += frontend.recv(65536)
    loop.join(timeout=10)
    worker_end.close()
    assert not loop.is_alive() and handler.stopped.is_set()  # the frontend went away: the engine stopped
    assert handler.serving is loop  # the engine on the thread that loaded the model, the frontend read apart
    assert [request_id for request_id, _ in handler.accepted] == ["id-1", "id-2"]
    assert handler.accepted[0][1]["Content-Length"] == "70000"  # the request's own headers, as a dict
    assert b"id-1" in answers and bytes(range(5)) in answers  # answered by the handler's thread
    assert b"id-2" in answers and b"Prediction failed" in answers and b"ts_stream_next" in answers


def test_a_handler_not_declared_streaming_is_refused_at_load_under_async_communication():
    class Undeclared:  # accept() and serve() without the contract: not taken for one
        def accept(self, request_id, request, headers): ...
        def serve(self): ...
        def handle(self, data, context): ...

    class LoadedWorker(KitWorker):
        def load_model(self, request):
            return service_of(Undeclared().handle), "loaded", 200

    frontend, worker_end = socket.socketpair()
    worker = LoadedWorker.__new__(LoadedWorker)
    worker.async_comm = True
    with frontend, worker_end:
        frontend.sendall(load_frame())
        with pytest.raises(RuntimeError, match="needs a StreamingHandler"):
            worker.handle_connection(worker_end)
        answer = read_answer(frontend)
    assert struct.unpack("!i", answer[:4])[0] == 500 and b"StreamingHandler (handlers/streaming.py)" in answer


def answer_pieces(sock: socket.socket) -> list[tuple[str, dict]]:
    """(id, headers) of each piece of the next answer message."""
    from tests.unit.handlers.test_replies import Reader

    _, pieces = Reader(read_answer(sock)).frame()
    return [(p["id"], p["headers"]) for p in pieces]


def cached_frame(request_ids: list[str]) -> bytes:
    """A continuousBatching batch listing requests the worker has (ModelRequestEncoder: no parameters)."""
    frame = bytearray(otf.PREDICT_MSG)
    for request_id in request_ids:
        frame += field(request_id.encode()) + struct.pack("!i", -1) + struct.pack("!i", -1)
    return bytes(frame + struct.pack("!i", -1))


def test_the_steps_loop_accepts_new_requests_once_answers_each_batch_and_cancels_the_gone():
    handler = AcceptingHandler(more=True)

    class LoadedWorker(KitWorker):
        def load_model(self, request):
            service = service_of(handler.handle)
            service.context.model_yaml_config = {"continuousBatching": True}
            return service, "loaded", 200

    frontend, worker_end = socket.socketpair()
    worker = LoadedWorker.__new__(LoadedWorker)
    loop = threading.Thread(target=lambda: pytest.raises(SystemExit, worker.handle_connection, worker_end))
    loop.start()
    with frontend:
        frontend.settimeout(30)
        frontend.sendall(load_frame())
        assert struct.unpack("!i", read_answer(frontend)[:4])[0] == 200
        frontend.sendall(request_frame(REQUESTS))
        # One answer: id-1's piece and id-2's 503 (the handler raised), whole: continuousBatching
        # forgets a request with it, no release piece.
        pieces = answer_pieces(frontend)
        assert sorted(pieces) == [("id-1", {"ts_stream_next": "true"}), ("id-2", {})]
        frontend.sendall(cached_frame(["id-1"]))  # the next batch lists id-1 again: not a new request
        threading.Timer(0.2, handler.replies.send, ("id-1", b"x", "text/plain"), {"more": True}).start()
        assert answer_pieces(frontend) == [("id-1", {"ts_stream_next": "true"})]
        frontend.sendall(request_frame([("id-3", {}, b"hello", "application/json")]))  # id-1 left out: gone
        assert answer_pieces(frontend) == [("id-3", {"ts_stream_next": "true"})]
    loop.join(timeout=10)
    worker_end.close()
    assert not loop.is_alive() and handler.serving is loop
    assert [request_id for request_id, _ in handler.accepted] == ["id-1", "id-2", "id-3"]
    assert handler.cancelled == ["id-1"]
