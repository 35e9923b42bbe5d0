"""The OpenVINO GenAI peer: its continuous-batching pipeline (what OpenVINO Model Server runs)
behind OpenAI's completions API, and the export of a Hugging Face directory to what it loads.

    PEER_PY -m bench.openvino_genai_peer export MODEL_DIR OUT_DIR [--int8]
    PEER_PY -m bench.openvino_genai_peer serve IR_DIR --port 8700 --precision bf16 --sequences 8 --cache-gb 1

PEER_PY is the peer's own environment (bench/openvino_genai.py makes it): this module imports no
kit module but bench/completions.py. The export is optimum-intel's (the model with its KV cache
as state, as `optimum-cli export openvino` writes it) and openvino-tokenizers' (the tokenizer and
detokenizer as OpenVINO models, which the pipeline tokenizes with); --int8 compresses the weights
to int8, what its users serve. Serving: one ContinuousBatchingPipeline on the CPU with the kit's
number of sequences, `step()` in a thread of its own while requests run (add_request is
thread-safe); each request's new tokens decoded as they come. Everything else is OpenVINO
GenAI's default: its scheduler's chunked prefill, its KV cache precision.
"""

from __future__ import annotations

import argparse
import itertools
import queue
import threading
from pathlib import Path

from bench.completions import HOST

# --precision: the CPU plugin's inference precision (weights converted to it when compiled).
PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}
END = None  # a request's queue: lists of new token ids, then END


def export(model_dir: Path, out: Path, int8: bool) -> None:
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig
    from transformers import AutoTokenizer

    options = {"quantization_config": OVWeightQuantizationConfig(bits=8)} if int8 else {"load_in_8bit": False}
    OVModelForCausalLM.from_pretrained(model_dir, export=True, compile=False, **options).save_pretrained(out)
    tokenizer, detokenizer = convert_tokenizer(AutoTokenizer.from_pretrained(model_dir), with_detokenizer=True)
    ov.save_model(tokenizer, out / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, out / "openvino_detokenizer.xml")


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


def build_app(ir_dir: str, precision: str | None, sequences: int, cache_gb: int):
    import openvino_genai
    from fastapi.responses import JSONResponse, StreamingResponse

    from bench import completions
    from bench.completions import Completion

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.max_num_seqs, scheduler.cache_size = sequences, cache_gb
    properties = {"INFERENCE_PRECISION_HINT": PRECISIONS[precision]} if precision else {}
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
        return StreamingResponse(answer.events(texts(), prompt_tokens, lambda: len(generated)),
                                 media_type="text/event-stream")  # fmt: skip

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    to_ir = commands.add_parser("export")
    to_ir.add_argument("model_dir", type=Path)
    to_ir.add_argument("out", type=Path)
    to_ir.add_argument("--int8", action="store_true")
    serve = commands.add_parser("serve")
    serve.add_argument("ir_dir")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--precision", choices=sorted(PRECISIONS), help="none: the CPU plugin's default")
    serve.add_argument("--sequences", type=int, required=True)
    serve.add_argument("--cache-gb", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "export":
        export(args.model_dir, args.out, args.int8)
        return
    import uvicorn

    app = build_app(args.ir_dir, args.precision, args.sequences, args.cache_gb)
    uvicorn.run(app, host=HOST, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
