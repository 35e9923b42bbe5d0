"""BERT encoders as plain tensor-in/tensor-out modules, easy to compile and export.

    classifier = BertClassifier(BertConfig(num_labels=2))  # logits [B, num_labels]
    embedder = SentenceEmbedder(minilm_config)               # unit vectors [B, hidden]

Both subclass the transformers models, so their state-dict keys are the Hugging Face ones
and a fine-tuned checkpoint loads unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from handlers.quiet_imports import torchao_import

with torchao_import():  # transformers imports torchao when it is installed
    from transformers import BertConfig, BertForSequenceClassification, BertModel


class BertClassifier(BertForSequenceClassification):
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        # input_ids, attention_mask, token_type_ids: [B, S] int64 -> logits [B, num_labels]
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


class SentenceEmbedder(BertModel):
    """Mean pooling over real tokens, then L2 normalisation (sentence-transformers' recipe)."""

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden = (
            super()
            .forward(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            .last_hidden_state
        )  # [B, S, H]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, S, 1]
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, H]
        return nn.functional.normalize(pooled, p=2, dim=1)
