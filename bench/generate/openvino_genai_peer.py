"""The OpenVINO GenAI peer: its continuous-batching pipeline (what OpenVINO Model Server runs)
behind OpenAI's completions API.

    OV_PY -m bench.generate.openvino_genai_peer serve IR_DIR --port 8700 --precision bfloat16 --sequences 8 \
        --cache-gb 1 --kv-precision bf16

OV_PY is the OpenVINO GenAI environment (model_store/openvino_lm.py makes it): this module
imports no kit module but bench/generate/completions.py. IR_DIR is model_store/openvino_lm_export.py's
(the pipeline tokenizes with its tokenizer's model). Serving: one ContinuousBatchingPipeline on the CPU with the kit's
number of sequences and its KV precision (KV_CACHE_PRECISION: the CPU plugin's default is 8
bits), `step()` in a thread of its own while requests run (add_request is thread-safe); each
request's new tokens decoded as they come. Everything else is OpenVINO GenAI's default: its
scheduler's chunked prefill of 256 tokens a step.
"""

from __future__ import annotations

import argparse
import itertools
import queue
import threading

from bench.generate.completions import HOST

# --precision: the CPU plugin's inference precision (weights converted to it when compiled).
PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}
END = None  # a request's queue: lists of new token ids, then END


class Engine:
    """The pipeline stepped in one thread while any request runs; each request's new token ids go
    to its queue."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.cond = threading.Condition()
        self.running: dict[int, tuple[object, queue.Queue]] = {}
        self.ids = itertools.count()
        threading.Thread(target=self.run, name="steps", daemon=True).start()

    def submit(self, prompt: str, config) -> queue.Queue:
        tokens: queue.Queue = queue.Queue()
        with self.cond:
            request_id = next(self.ids)
            self.running[request_id] = (self.pipeline.add_request(request_id, prompt, config), tokens)
            self.cond.notify()
        return tokens

    def run(self) -> None:
        import openvino_genai

        while True:
            with self.cond:
                while not self.running:
                    self.cond.wait()
            self.pipeline.step()
            with self.cond:
                for request_id, (handle, tokens) in list(self.running.items()):
                    if handle.can_read():
                        for output in handle.read().values():
                            tokens.put(list(output.generated_ids))
                    if handle.get_status() != openvino_genai.GenerationStatus.RUNNING:
                        tokens.put(END)
                        del self.running[request_id]


def build_app(ir_dir: str, precision: str | None, sequences: int, cache_gb: int, kv: str):
    import openvino_genai
    from fastapi.responses import JSONResponse, StreamingResponse

    from bench.generate import completions
    from bench.generate.completions import Completion

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.max_num_seqs, scheduler.cache_size = sequences, cache_gb
    properties = {"KV_CACHE_PRECISION": kv}
    if precision:
        properties["INFERENCE_PRECISION_HINT"] = PRECISIONS[precision]
    pipeline = openvino_genai.ContinuousBatchingPipeline(ir_dir, scheduler, "CPU", properties)
    tokenizer = pipeline.get_tokenizer()
    engine = Engine(pipeline)
    app = completions.app()

    @app.post("/v1/completions")
    def complete(body: dict):
        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = int(body.get("max_tokens") or 16)
        config.ignore_eos = bool(body.get("ignore_eos"))
        config.do_sample = False
        prompt_tokens = int(tokenizer.encode(body["prompt"]).input_ids.get_shape()[-1])
        tokens, generated = engine.submit(body["prompt"], config), []

        def texts():
            shown = ""
            while (new := tokens.get()) is not END:
                generated.extend(new)
                text = tokenizer.decode(generated)
                if not text.endswith("\ufffd"):  # a character's bytes still coming
                    yield text[len(shown) :]
                    shown = text
            yield tokenizer.decode(generated)[len(shown) :]

        answer = Completion(body.get("model"))
        if not body.get("stream"):
            return JSONResponse(answer.whole("".join(texts()), prompt_tokens, len(generated)))
        return StreamingResponse(
            answer.events(texts(), prompt_tokens, lambda: len(generated)), media_type="text/event-stream"
        )

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("ir_dir")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--precision", choices=sorted(PRECISIONS), help="none: the CPU plugin's default")
    serve.add_argument("--sequences", type=int, required=True)
    serve.add_argument("--cache-gb", type=int, required=True)
    serve.add_argument("--kv-precision", required=True, help="KV_CACHE_PRECISION: f32, bf16, ... (the plugin checks)")
    args = parser.parse_args(argv)
    import uvicorn

    app = build_app(args.ir_dir, args.precision, args.sequences, args.cache_gb, args.kv_precision)
    uvicorn.run(app, host=HOST, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
