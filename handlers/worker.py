"""The kit's TorchServe worker: TorchServe 0.12's Python worker loop without its per-request extras.

    python -m handlers.worker --sock-type unix --sock-name /tmp/.ts.sock.9000 --metrics-config ...

kit/pin_worker.py runs it in place of ts/model_service_worker.py, with the same arguments, in the
model's unpacked archive (where this package is). Same socket protocol, same model loading and
answer encoding (TorchServe's own functions); per request it leaves out what py-spy showed a
worker spending on things nobody reads (openvino-int8 ResNet-50, docs/benchmarks.md "Where a
worker's time goes"):
- two stdout lines, "Backend received inference at: ..." and the PredictionTime [METRICS] line
  (with a gethostname() system call), which the frontend reads back, parses and logs: ~7 % of the
  worker's CPU and some of the frontend's. The kit's own stage histograms (handlers/stages.py)
  say more, for a fraction of the cost;
- a recv() system call per field of the request frame (4 per HTTP header): the frame is read
  through a buffer, usually in one or two system calls.
A handler that is not one of the kit's (no stage clock) is served the same way, untimed.

A language model (handlers/text_generation.py) is served over one of TorchServe's two generative
protocols (its `batching` setting): with asyncCommunication the loop only reads, each request
going to the handler's accept() as it arrives while the handler's own threads answer it
(handlers/replies.py, Replies); with continuousBatching each batch's new requests go to accept(),
the requests the frontend left out of it (their clients went away) to cancel(), and the loop
answers the batch with what the handler's threads wrote since the last one (StepReplies).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from ts.arg_parser import ArgParser
from ts.model_service_worker import SOCKET_ACCEPT_TIMEOUT, TorchModelServiceWorker
from ts.protocol import otf_message_handler as otf
from ts.service import Service
from ts.utils.util import PredictionException

from handlers.payload import error_body, over_grpc
from handlers.replies import Replies, StepReplies, Transport
from handlers.stages import Stage, StageClock, now
from handlers.streaming import StreamingHandler

log = logging.getLogger(__name__)
READ_BUFFER = 256 * 1024  # a typical request frame (a JPEG, a text) in one or two reads


class BufferedConnection:
    """What TorchServe's frame parsers call (`recv(n)`), served from a buffered reader: each call
    returns exactly n bytes, or b"" when the frontend has gone (the parsers then exit, as with recv)."""

    def __init__(self, connection: socket.socket):
        self.file = connection.makefile("rb", buffering=READ_BUFFER)
        self.recv = self.file.read


def predict(service: Service, batch: list[dict[str, Any]]) -> bytearray:
    """Service.predict without its PredictionTime metric: the same errors, codes and answer frame."""
    headers, inputs, request_ids = Service.retrieve_data_for_inference(batch)
    context = service.context
    context.request_ids = request_ids
    context.request_processor = headers
    context.metrics.request_ids = request_ids
    context.cl_socket = service.cl_socket
    try:
        answers = service._entry_point(inputs, context)
    except MemoryError:
        log.error("System out of memory", exc_info=True)
        return otf.create_predict_response(None, request_ids, "Out of resources", 507)
    except PredictionException as error:
        log.error("Prediction error", exc_info=True)
        return otf.create_predict_response(None, request_ids, error.message, error.error_code)
    except Exception:  # noqa: BLE001 - as TorchServe: the worker answers 503 and stays up
        log.warning("Invoking custom service failed.", exc_info=True)
        return otf.create_predict_response(None, request_ids, "Prediction failed", 503)
    if not isinstance(answers, list) or len(answers) != len(inputs):
        log.warning("model %s answered %r for %d requests", context.model_name, type(answers), len(inputs))
        return otf.create_predict_response(None, request_ids, "number of batch response mismatched", 503)
    return otf.create_predict_response(answers, request_ids, "Prediction success", 200, context=context)


def handler_of(service: Service) -> Any:
    """The handler object whose method TorchServe calls (None for a function handler)."""
    return getattr(service._entry_point, "__self__", None)


def stage_clock(service: Service) -> StageClock | None:
    """The kit handler's clock (handlers/base.py), which this loop adds the frame stages to."""
    return getattr(handler_of(service), "stages", None)


def accept_all(service: Service, batch: list[dict[str, Any]], replies: Transport) -> list[str]:
    """Hand each new request of the batch to the handler, which answers it when it likes (under
    continuousBatching a batch also lists the requests the handler already has); the batch's ids."""
    headers, inputs, request_ids = Service.retrieve_data_for_inference(batch)
    handler = handler_of(service)
    for index, request_id in request_ids.items():
        if not replies.new(request_id):
            continue
        properties = headers[index].get_request_properties()
        try:
            handler.accept(request_id, inputs[index], properties)
        except Exception:  # noqa: BLE001 - as TorchServe: the request fails, the worker stays up
            log.warning("Invoking custom service failed.", exc_info=True)
            body = json.dumps(error_body("Prediction failed", 503)).encode()
            replies.refuse(request_id, body, "application/json", 503, "Prediction failed", over_grpc(properties))
    return list(request_ids.values())


def steps_of(service: Service) -> bool:
    """Whether the model is served with continuousBatching by a handler that answers by itself."""
    config = service.context.model_yaml_config or {}
    return bool(config.get("continuousBatching")) and isinstance(handler_of(service), StreamingHandler)


class KitWorker(TorchModelServiceWorker):
    async_comm = False  # TorchServe's __init__ sets it from --async

    def handle_connection(self, cl_socket: socket.socket) -> None:
        if self.async_comm:
            self.handle_connection_async(cl_socket)
            return
        connection = BufferedConnection(cl_socket)
        service, clock, sent = None, None, None
        while True:
            command = otf._retrieve_buffer(connection, 1)
            if command == otf.PREDICT_MSG:
                if service is None:
                    raise RuntimeError("received an inference request before the model was loaded")
                start = now()  # the first byte is here: idle time is the wait's
                batch = otf._retrieve_inference_msg(connection)
                read = now()
                answer = predict(service, batch)
                answered = now()
                cl_socket.sendall(answer)
                if clock is not None:
                    if sent is not None:  # not before the first call: loading is no wait for work
                        clock.record(Stage.WAIT, sent, start, len(batch))
                    sent = now()
                    clock.record(Stage.READ, start, read, len(batch))
                    clock.record(Stage.WRITE, answered, sent, len(batch))
            elif command == otf.LOAD_MSG:
                service, result, code = self.load(connection, cl_socket)
                cl_socket.sendall(otf.create_load_model_response(code, result))
                if code != 200:
                    raise RuntimeError(f"{code} - {result}")
                if steps_of(service):
                    self.serve_steps(connection, cl_socket, service)
                    return
                service.set_cl_socket(cl_socket)
                clock = stage_clock(service)
            else:
                raise ValueError(f"received unknown command: {command!r}")

    def load(self, connection: BufferedConnection, cl_socket: socket.socket) -> tuple[Service, str, int]:
        """TorchServe's load_model. A handler that raises in initialize is said in this worker's
        output, flushed, before the frontend hears of it: once it does it stops relaying this
        process's output, and a traceback written after that was lost (the reason never reached
        the model log, under load: CI run of f2aba20)."""
        try:
            return self.load_model(otf._retrieve_load_msg(connection))
        except Exception as error:
            log.exception("Failed to load model: %s", error)
            sys.stdout.flush()
            sys.stderr.flush()
            cl_socket.sendall(otf.create_load_model_response(500, f"{type(error).__name__}: {error}"))
            raise

    def handle_connection_async(self, cl_socket: socket.socket) -> None:
        """asyncCommunication: the model is loaded, then served (serve_generation), each request
        going to the handler's accept() as it arrives."""
        connection = BufferedConnection(cl_socket)
        replies = Replies(cl_socket)
        if otf._retrieve_buffer(connection, 1) != otf.LOAD_MSG:
            raise RuntimeError("received an inference request before the model was loaded")
        service, result, code = self.load(connection, cl_socket)
        if code == 200 and not isinstance(handler_of(service), StreamingHandler):
            result, code = (
                "asyncCommunication needs a StreamingHandler (handlers/streaming.py), as text generation's",
                500,
            )
        cl_socket.sendall(otf.create_load_model_response(code, result))
        if code != 200:
            raise RuntimeError(f"{code} - {result}")

        def read() -> None:
            while True:
                command = otf._retrieve_buffer(connection, 1)
                if command != otf.PREDICT_MSG:
                    raise ValueError(f"received {command!r} where an inference request was expected")
                accept_all(service, otf._retrieve_inference_msg(connection), replies)

        serve_generation(handler_of(service), replies, read)

    def serve_steps(self, connection: BufferedConnection, cl_socket: socket.socket, service: Service) -> None:
        """continuousBatching, once the model is loaded (serve_generation): a batch in, one answer
        out, until the frontend goes away."""
        replies, handler = StepReplies(), handler_of(service)

        def read() -> None:
            while True:
                command = otf._retrieve_buffer(connection, 1)
                if command != otf.PREDICT_MSG:
                    raise ValueError(f"received {command!r} where an inference batch was expected")
                request_ids = accept_all(service, otf._retrieve_inference_msg(connection), replies)
                for request_id in replies.batch(request_ids):
                    handler.cancel(request_id)
                replies.handled()
                cl_socket.sendall(replies.answer())

        serve_generation(handler, replies, read)


def serve_generation(handler: StreamingHandler, replies: Transport, read: Callable[[], None]) -> None:
    """A language model served: `read` (the frontend's messages) in a thread of its own, and the
    handler's engine on this thread, the one that loaded and warmed it up, until the frontend
    goes away. Its OpenMP threads are this thread's: a step computed from another thread would
    start a second pool of them, and on a machine with no core to spare the two pools' threads
    waited for each other (a decode step took half as long again, in-process on 2 cores)."""
    ended: list[BaseException] = []

    def frontend() -> None:
        try:
            read()
        except BaseException as error:  # noqa: BLE001 - SystemExit when the frontend closes: the worker ends with it
            ended.append(error)
        finally:
            replies.close()
            handler.stop()

    handler.connect(replies)
    threading.Thread(target=frontend, name="frontend", daemon=True).start()
    try:
        handler.serve()
    except OSError:  # the frontend went away while the engine answered: nothing to answer to
        log.info("the frontend closed the connection while answers were being sent")
    raise ended[0] if ended else SystemExit(1)


def main() -> None:
    # As ts/model_service_worker.py's own main: INFO lines on stdout, which the frontend logs.
    logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO)
    args = ArgParser.model_service_worker_args().parse_args()
    try:
        worker = KitWorker(args.sock_type, args.sock_name, args.host, args.port, args.metrics_config, args.async_comm)
        worker.run_server()
    except TimeoutError:
        log.error("Backend worker did not receive connection in: %d", SOCKET_ACCEPT_TIMEOUT)
    except Exception:  # noqa: BLE001 - logged for the frontend's model_log, as TorchServe does
        log.error("Backend worker process died.", exc_info=True)
    finally:
        if args.sock_type == "unix" and args.sock_name and os.path.exists(args.sock_name):
            os.remove(args.sock_name)
    sys.exit(1)


if __name__ == "__main__":
    main()
