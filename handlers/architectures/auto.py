"""Hugging Face Transformers models behind the kit's tensor-in/tensor-out contract.

    model = text_model(AutoModelForSequenceClassification.from_pretrained(d), settings, logits)
    model(ids, mask)                  # logits [B, num_labels]; (ids, mask, token_type_ids) if the model takes them

Each forward has explicit positional parameters (torch.export, AOTInductor and OpenVINO map
example inputs to them one by one) in the kit's order (handlers/text.py ENCODING_FIELDS), and
returns one tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from handlers.settings import Pooling, TextSettings

Head = Callable[[Any, torch.Tensor], torch.Tensor]  # (the model's outputs, attention_mask) -> [B, ...]


class TextModel(nn.Module):
    def __init__(self, model: nn.Module, head: Head):
        super().__init__()
        self.model, self.head = model, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # input_ids, attention_mask: [B, S] int64
        return self.head(self.model(input_ids=input_ids, attention_mask=attention_mask), attention_mask)


class TextModelWithTypes(TextModel):
    """For models whose forward also takes token_type_ids (BERT, ALBERT, ...)."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return self.head(outputs, attention_mask)


def logits(outputs, attention_mask: torch.Tensor) -> torch.Tensor:
    return outputs.logits  # [B, num_labels]


def pooled(settings: TextSettings) -> Head:
    """Token states pooled into one vector per text, of unit length if settings.normalize."""

    def head(outputs, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = outputs.last_hidden_state  # [B, S, H]
        if settings.pooling is Pooling.CLS:
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, S, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, H]
        return nn.functional.normalize(pooled, p=2, dim=1) if settings.normalize else pooled

    return head


def text_model(model: nn.Module, settings: TextSettings, head: Head) -> TextModel:
    """The wrapper whose forward takes exactly settings.input_names (model_store/huggingface.py orders them)."""
    return (TextModelWithTypes if "token_type_ids" in settings.input_names else TextModel)(model, head)


class ImageClassifier(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # pixel_values: [B, 3, H, W] -> logits [B, num_labels]
        return self.model(pixel_values=pixel_values).logits
