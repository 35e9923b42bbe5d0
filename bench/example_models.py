"""Hugging Face directories of architectures the kit does not bundle, random weights, for trying
`make model` without a download and for the bench's "your model" table.

    .venv/bin/python -m bench.example_models distilbert /tmp/distilbert   # DistilBERT-base classifier, 66 M
    .venv/bin/python -m bench.example_models vit /tmp/vit                 # ViT-B/16 classifier, 86 M, 224 px
    .venv/bin/python -m bench.example_models qwen2 /tmp/qwen2             # Qwen2-style causal LM, grouped KV heads
    .venv/bin/python -m bench.example_models gpt2 /tmp/gpt2               # GPT-2-style causal LM
    .venv/bin/python -m bench.example_models qwen2-repeating /tmp/rep     # qwen2's, answers repeat their last token
    .venv/bin/python -m bench.example_models qwen3 /tmp/qwen3             # Qwen3-0.6B's shape: norms on queries and keys
    .venv/bin/python -m bench.example_models llama /tmp/llama             # Llama-3.2-1B's shape: Llama 3's RoPE scaling

Written with save_pretrained, as a fine-tuned checkpoint is: config.json (labels in id2label),
model.safetensors, the tokenizer (bert-base-uncased's vocabulary, shipped in a pip package) or
the image processor. Seeded: the same bytes on every machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

SEED = 0
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
ANIMALS = {0: "cat", 1: "dog", 2: "bird", 3: "fish", 4: "frog", 5: "horse"}


def distilbert(directory: Path, dim: int = 768, layers: int = 6, heads: int = 12, init: float = 0.02) -> Path:
    """A DistilBERT sequence classifier: its forward takes no token_type_ids."""
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, DistilBertTokenizerFast

    from model_store.recipes import bundled_tokenizer

    torch.manual_seed(SEED)
    tokenizer = DistilBertTokenizerFast(tokenizer_file=str(bundled_tokenizer()))
    config = DistilBertConfig(
        vocab_size=tokenizer.vocab_size,
        dim=dim,
        hidden_dim=4 * dim,
        n_layers=layers,
        n_heads=heads,
        initializer_range=init,
        id2label=SENTIMENT,
        label2id={v: k for k, v in SENTIMENT.items()},
    )
    DistilBertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def vit(
    directory: Path,
    size: int = 224,
    patch: int = 16,
    dim: int = 768,
    layers: int = 12,
    heads: int = 12,
    init: float = 0.02,
) -> Path:
    """A ViT image classifier with its image processor (resize to size x size, mean/std 0.5)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(SEED)
    config = ViTConfig(
        image_size=size,
        patch_size=patch,
        hidden_size=dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * dim,
        initializer_range=init,
        id2label=ANIMALS,
        label2id={v: k for k, v in ANIMALS.items()},
    )
    ViTForImageClassification(config).save_pretrained(directory)
    ViTImageProcessor(size={"height": size, "width": size}).save_pretrained(directory)
    return directory


# ChatML with Hermes-style tools, as Qwen2.5's tokenizers carry it (shorter): the chat endpoint
# renders messages with it; tools go into the system turn, calls in <tool_call> blocks, a tool's
# answer in a user turn's <tool_response>.
CHATML = (  # no literal newline right after a tag: transformers renders with trim_blocks
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{{ '\\n\\n' }}{% endif %}# Tools\n\nYou may call one or more functions. Their signatures are within "
    "<tools></tools>:\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each call, return a JSON object with the function's name and arguments within <tool_call></tool_call>:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}'
    "{% for message in messages %}{% if message['role'] == 'system' and tools and loop.first %}"
    "{% elif message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}{{ '\\n' }}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>")  # Qwen's: one token each, ordinary (decoded with the text)


def causal_tokenizer(chat: bool = True, size: int = 0, trained: int = 512):
    """A byte-level BPE tokenizer (GPT-2's and Qwen's kind: any text encodes) trained here on the
    kit's calibration sentences: no download. <|endoftext|> ends a text, <|im_end|> a chat turn.
    `size` > `trained` grows the vocabulary with words " w<n>" that no merge makes: a random model
    picks any id of a real-size vocabulary, and each decodes to text, as a real tokenizer's would.
    They are ordinary vocabulary entries, not added tokens, so a converter (llama.cpp's GGUF) keeps
    them ordinary: tens of thousands of added tokens would be matched against every prompt."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from handlers.calibration import SENTENCES

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=trained, special_tokens=list(CHAT_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(list(SENTENCES) * 4, trainer)
    added = TOOL_TOKENS if chat else ()  # the last ids, as Qwen's are within its vocabulary size
    size -= len(added) if size else 0
    if size > bpe.get_vocab_size():
        state = json.loads(bpe.to_str())
        vocabulary = state["model"]["vocab"]
        # "\u0120" is how byte-level BPE spells a space
        vocabulary.update({f"\u0120w{index}": index for index in range(len(vocabulary), size)})
        bpe = Tokenizer.from_str(json.dumps(state))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if chat:
        tokenizer.chat_template = CHATML
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in added])
    return tokenizer


def _save_causal(model, tokenizer, directory: Path, eos: list[int]) -> Path:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(eos_token_id=eos, do_sample=False)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# Qwen2.5's vocabulary: its embedding and output projection are a quarter of a 0.5B model's work.
QWEN_VOCABULARY = 151936


def _chat_lm(directory: Path, architecture: str, vocabulary: int, **config) -> Path:
    """A causal LM of transformers' `architecture` (Qwen2, Qwen3, Llama: <name>Config and
    <name>ForCausalLM), random and seeded, with the trained tokenizer grown to `vocabulary` ids, a
    ChatML template, and <|im_end|> and <|endoftext|> as its ends; `config`: the shape."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    tokenizer = causal_tokenizer(size=vocabulary)
    settings = getattr(transformers, f"{architecture}Config")(
        vocab_size=len(tokenizer), eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), **config
    )
    model = getattr(transformers, f"{architecture}ForCausalLM")(settings)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return _save_causal(model, tokenizer, directory, eos)


def qwen2(
    directory: Path,
    dim: int = 896,
    layers: int = 24,
    heads: int = 14,
    kv_heads: int = 2,
    init: float = 0.02,
    vocabulary: int = QWEN_VOCABULARY,
) -> Path:
    """A Qwen2 causal LM (Llama-style: RoPE, RMSNorm, grouped KV heads) with a ChatML template;
    the defaults are Qwen2.5-0.5B's shape and vocabulary size (0: the trained tokenizer's own)."""
    return _chat_lm(
        directory,
        "Qwen2",
        vocabulary,
        hidden_size=dim,
        intermediate_size=int(dim * 5.4) // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
        initializer_range=init,
        tie_word_embeddings=True,
    )


def qwen3(
    directory: Path,
    dim: int = 1024,
    layers: int = 28,
    heads: int = 16,
    kv_heads: int = 8,
    head_dim: int = 128,
    intermediate: int = 3072,
    init: float = 0.02,
    vocabulary: int = QWEN_VOCABULARY,
) -> Path:
    """A Qwen3 causal LM (Qwen2's, with an RMSNorm on each head's queries and keys and heads wider
    than dim / heads) with a ChatML template; the defaults are Qwen3-0.6B's shape and vocabulary size."""
    return _chat_lm(
        directory,
        "Qwen3",
        vocabulary,
        hidden_size=dim,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        initializer_range=init,
        tie_word_embeddings=True,
    )


# Llama 3's long-context RoPE: its frequencies scaled by band (Llama-3.2-1B's config.json).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def llama(
    directory: Path,
    dim: int = 2048,
    layers: int = 16,
    heads: int = 32,
    kv_heads: int = 8,
    intermediate: int = 8192,
    init: float = 0.02,
    vocabulary: int = 128256,
) -> Path:
    """A Llama causal LM with Llama 3's RoPE and a ChatML template; the defaults are
    Llama-3.2-1B's shape and vocabulary size."""
    return _chat_lm(
        directory,
        "Llama",
        vocabulary,
        hidden_size=dim,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=131072,
        rope_parameters=LLAMA3_ROPE,
        rms_norm_eps=1e-5,
        initializer_range=init,
        tie_word_embeddings=True,
    )


def qwen2_repeating(directory: Path, **shape: int) -> Path:
    """qwen2()'s model whose layers add nothing (every attention and MLP output projection zero): a
    position's last hidden state is its token's embedding, which the tied head scores highest, so
    the greedy answer repeats the prompt's last token at the full model's cost. Prompt lookup's
    best case (after its first few tokens every draft is kept): the generate bench's `copy`
    workload on it measures the most lookup can give on this CPU, random weights its least."""
    import torch
    from transformers import AutoModelForCausalLM

    qwen2(directory, **shape)
    model = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(directory)
    return directory


def gpt2(
    directory: Path, dim: int = 768, layers: int = 12, heads: int = 12, init: float = 0.02, vocabulary: int = 50257
) -> Path:
    """A GPT-2 causal LM (learned positions, LayerNorm, fused QKV) without a chat template;
    the defaults are GPT-2 small's shape and vocabulary size (0: the trained tokenizer's own)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    tokenizer = causal_tokenizer(chat=False, size=vocabulary)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=dim,
        n_layer=layers,
        n_head=heads,
        n_positions=1024,
        initializer_range=init,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    return _save_causal(GPT2LMHeadModel(config), tokenizer, directory, [eos])


EXAMPLES: dict[str, Callable[[Path], Path]] = {
    "distilbert": distilbert,
    "vit": vit,
    "qwen2": qwen2,
    "qwen2-repeating": qwen2_repeating,
    "qwen3": qwen3,
    "llama": llama,
    "gpt2": gpt2,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("example", choices=sorted(EXAMPLES))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    EXAMPLES[args.example](args.directory)
    print(f"[example] {args.example} written to {args.directory}: make model NAME={args.example} SRC={args.directory}")


if __name__ == "__main__":
    main()
