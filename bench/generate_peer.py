"""The generative peer: what a user writes instead of the kit, FastAPI over transformers' `generate`.

    python -m bench.generate_peer MODEL_DIR --port 8700 --dtype bfloat16

OpenAI's completions API (streamed with transformers' TextIteratorStreamer, usage included,
`ignore_eos` as min_new_tokens), one process, torch's default threads, each request its own
`generate` call in FastAPI's thread pool: concurrent requests run side by side, unbatched, as
such an app does. The model loads in the dtype asked (bf16 weights where the CPU computes bf16).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

HOST = "127.0.0.1"
HEALTH_PATH = "/health"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_app(model_dir: str, dtype: str) -> FastAPI:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).eval()
    app = FastAPI()

    @app.get(HEALTH_PATH)
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/completions")
    def completions(body: dict):
        ids = tokenizer(body["prompt"], return_tensors="pt").input_ids
        new = int(body.get("max_tokens") or 16)
        options = {"max_new_tokens": new, "do_sample": False}
        if body.get("ignore_eos"):
            options["min_new_tokens"] = new
        name, created = f"cmpl-{uuid.uuid4()}", int(time.time())

        def chunk(text: str, reason: str | None) -> str:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            return json.dumps(
                {
                    "id": name,
                    "object": "text_completion",
                    "created": created,
                    "model": body.get("model"),
                    "choices": [choice],
                }
            )

        if not body.get("stream"):
            with torch.inference_mode():
                out = model.generate(ids, **options)[0, ids.shape[1] :]
            usage = {
                "prompt_tokens": ids.shape[1],
                "completion_tokens": len(out),
                "total_tokens": ids.shape[1] + len(out),
            }
            return JSONResponse(
                {**json.loads(chunk(tokenizer.decode(out, skip_special_tokens=True), "length")), "usage": usage}
            )
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        produced: list[int] = []

        def run() -> None:
            with torch.inference_mode():
                out = model.generate(ids, streamer=streamer, **options)
            produced.append(out.shape[1] - ids.shape[1])

        def events():
            worker = threading.Thread(target=run)
            worker.start()
            for text in streamer:
                if text:
                    yield f"data: {chunk(text, None)}\n\n"
            worker.join()
            yield f"data: {chunk('', 'length')}\n\n"
            usage = {
                "prompt_tokens": ids.shape[1],
                "completion_tokens": produced[0],
                "total_tokens": ids.shape[1] + produced[0],
            }
            yield (
                "data: "
                + json.dumps(
                    {"id": name, "object": "text_completion", "created": created, "choices": [], "usage": usage}
                )
                + "\n\n"
            )
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

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
