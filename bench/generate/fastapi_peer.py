"""The generative peer: what a user writes instead of the kit, FastAPI over transformers' `generate`.

    python -m bench.generate.fastapi_peer MODEL_DIR --port 8700 --dtype bfloat16

OpenAI's completions API (streamed with transformers' TextIteratorStreamer, usage included,
`ignore_eos` as min_new_tokens), one process, torch's default threads, each request its own
`generate` call in FastAPI's thread pool: concurrent requests run side by side, unbatched, as
such an app does. The model loads in the dtype asked (bf16 weights where the CPU computes bf16).
"""

from __future__ import annotations

import argparse
import threading

import torch
import uvicorn
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

from bench.generate import completions
from bench.generate.completions import HOST, Completion

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_app(model_dir: str, dtype: str):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).eval()
    app = completions.app()

    @app.post("/v1/completions")
    def complete(body: dict):
        ids = tokenizer(body["prompt"], return_tensors="pt").input_ids
        new = int(body.get("max_tokens") or 16)
        options = {"max_new_tokens": new, "do_sample": False}
        if body.get("ignore_eos"):
            options["min_new_tokens"] = new
        answer = Completion(body.get("model"))
        if not body.get("stream"):
            with torch.inference_mode():
                out = model.generate(ids, **options)[0, ids.shape[1] :]
            return JSONResponse(answer.whole(tokenizer.decode(out, skip_special_tokens=True), ids.shape[1], len(out)))
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        produced: list[int] = []

        def run() -> None:
            with torch.inference_mode():
                out = model.generate(ids, streamer=streamer, **options)
            produced.append(out.shape[1] - ids.shape[1])

        worker = threading.Thread(target=run)
        worker.start()
        return StreamingResponse(
            answer.events(streamer, ids.shape[1], lambda: (worker.join(), produced[0])[1]),
            media_type="text/event-stream",
        )

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    args = parser.parse_args(argv)
    uvicorn.run(build_app(args.model_dir, args.dtype), host=HOST, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
