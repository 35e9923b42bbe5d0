"""A language model's Hugging Face directory exported to what OpenVINO GenAI's pipeline loads.

    OV_PY -m model_store.openvino_lm_export MODEL_DIR OUT_DIR [--weights float32|float16|int8]

OV_PY is the OpenVINO GenAI environment's python (model_store/openvino_lm.py makes it): of the
kit this module imports only openvino_lm's IrWeights (the standard library beneath it). The
export is optimum-intel's (the model with its KV cache as state, as `optimum-cli export
openvino` writes it) and openvino-tokenizers' (the tokenizer and detokenizer as OpenVINO models). --weights: how the IR stores the weights. float16 halves
float32's file (`optimum-cli export openvino --weight-format fp16`); int8 compresses the linear
weights to int8 (one scale per output channel, NNCF), what OpenVINO's users serve.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from model_store.openvino_lm import IrWeights


def export(model_dir: Path, out: Path, weights: IrWeights) -> None:
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig
    from transformers import AutoTokenizer

    int8 = weights is IrWeights.INT8
    options = {"quantization_config": OVWeightQuantizationConfig(bits=8)} if int8 else {"load_in_8bit": False}
    model = OVModelForCausalLM.from_pretrained(model_dir, export=True, compile=False, **options)
    if weights is IrWeights.FLOAT16:
        model.half()
    model.save_pretrained(out)
    tokenizer, detokenizer = convert_tokenizer(AutoTokenizer.from_pretrained(model_dir), with_detokenizer=True)
    ov.save_model(tokenizer, out / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, out / "openvino_detokenizer.xml")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--weights", type=IrWeights, choices=list(IrWeights), default=IrWeights.FLOAT32)
    args = parser.parse_args(argv)
    export(args.model_dir, args.out, args.weights)


if __name__ == "__main__":
    main()
