"""A torch.export program of a model the kit does not bundle, served as a `tensor` model.

    path = tabular_program(tmp_path / "ranker.pt2")   # forward(features [B, 8] float32, ids [B, 3] int64)

A small tabular scorer: numeric features through an MLP plus embedded categorical ids, three
scores per row. Two inputs of two element types, batch dimension exported dynamic, as a user must.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

FEATURES, IDS, CATEGORIES, SCORES = 8, 3, 20, 3


class TabularScorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, SCORES))
        self.embedding = nn.Embedding(CATEGORIES, SCORES)

    def forward(self, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(features) + self.embedding(ids).sum(dim=1)


def tabular_model(seed: int = 0) -> TabularScorer:
    torch.manual_seed(seed)
    return TabularScorer().eval()


def tabular_program(path: Path, model: nn.Module | None = None) -> Path:
    model = model or tabular_model()
    batch = torch.export.Dim("batch", max=1024)
    example = (torch.randn(2, FEATURES), torch.randint(0, CATEGORIES, (2, IDS)))
    program = torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch}))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, path)
    return path
