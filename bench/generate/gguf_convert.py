"""llama.cpp's Hugging Face -> GGUF converter, run from its source tree (bench/generate/llama_cpp.py).

    python -m bench.generate.gguf_convert LLAMA_CPP_TREE MODEL_DIR --outtype bf16 --outfile OUT.gguf

The converter names a BPE tokenizer's pre-tokenizer by hashing how it splits a fixed text, and
refuses a hash it has not listed. A tokenizer trained here (bench/example_models.py) is listed
nowhere, but its pre-tokenizer is GPT-2's own byte-level split, which llama.cpp implements as
"gpt-2": read from tokenizer.json, that one case is named instead of refused. Anything else is
still refused, as the converter would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# tokenizer.json's pre_tokenizer for GPT-2's split: ByteLevel with its regex, alone.
GPT2_SPLIT = {"type": "ByteLevel", "use_regex": True}


def gpt2_split(model_dir: Path) -> bool:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return False
    pre = json.loads(path.read_text()).get("pre_tokenizer") or {}
    return all(pre.get(key) == value for key, value in GPT2_SPLIT.items())


def main(argv: list[str]) -> None:
    tree, model_dir, *options = argv
    sys.path[:0] = [tree, str(Path(tree) / "gguf-py")]
    sys.argv = ["convert_hf_to_gguf.py", model_dir, *options]
    import convert_hf_to_gguf
    from conversion.base import TextModel

    listed = TextModel.get_vocab_base_pre

    def pre_tokenizer(self, tokenizer) -> str:
        try:
            return listed(self, tokenizer)
        except NotImplementedError:
            if gpt2_split(Path(model_dir)):
                return "gpt-2"
            raise

    TextModel.get_vocab_base_pre = pre_tokenizer
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(sys.argv[1:])
