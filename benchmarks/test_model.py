"""One training step of the shared backbone (bench/model.py) at the byte-LM CPU preset's shapes (batch 16 ×
256 bytes, width 128, 2 layers × 4 heads × 32, causal): forward, loss, backward and AdamW, per method of the
comparison grid that has a causal form."""

import pytest
import torch

from bench.model import Model, ModelConfig
from bench.loop import task_loss
from bench.methods import get, same_in_every_layer

CAUSAL_METHODS = ["full", "linear", "performer", "reformer", "sbm", "ssa"]


@pytest.mark.parametrize("method", CAUSAL_METHODS)
def test_backbone_training_step(benchmark, method, small):
    batch, seq_len = (2, 64) if small else (16, 256)
    cfg = ModelConfig(
        vocab_size=256,
        num_classes=256,
        head="lm",
        max_len=seq_len,
        dim=128,
        depth=2,
        heads=4,
        head_dim=32,
        mlp_dim=512,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = Model(cfg, same_in_every_layer(get(method).load(), cfg, {})).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(256, (batch, seq_len + 1), generator=g)
    tokens, targets = windows[:, :-1], windows[:, 1:]

    def step():
        logits, stats = model(tokens, generator=g)
        loss = task_loss(logits, targets) + stats["aux_loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    benchmark.group = "backbone training step (byte LM, CPU preset shapes)" + (" [small]" if small else "")
    benchmark(step)
