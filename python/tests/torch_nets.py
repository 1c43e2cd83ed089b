"""Small torch modules shared by the memcuda.torch tests and their child
processes: parameters, buffers of three dtypes (one bool), a non-persistent
buffer and tied weights (one Parameter under two names)."""
from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, seed: int = 0, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(16, width)
        self.lin = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width)              # running_mean/var (f32), num_batches_tracked (i64)
        self.head = nn.Linear(width, 16, bias=False)
        self.head.weight = self.emb.weight           # tied: "emb.weight" and "head.weight"
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("scratch", torch.zeros(4), persistent=False)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.num_batches_tracked.fill_(seed + 3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(torch.relu(self.lin(self.emb(idx)))))


def digest(module: nn.Module) -> dict:
    """{state-dict name: [dtype, shape, exact float64 sum]} of a module."""
    return {k: [str(v.dtype), list(v.shape), v.detach().double().sum().item()]
            for k, v in module.state_dict().items()}


def scale_(module: nn.Module, factor: float) -> None:
    """An in-place 'training step' on every floating parameter and buffer."""
    seen = set()
    with torch.no_grad():
        for v in module.state_dict().values():
            if v.is_floating_point() and v.data_ptr() not in seen:  # a tied tensor once
                seen.add(v.data_ptr())
                v.mul_(factor)
