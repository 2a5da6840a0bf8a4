"""A trained model's chosen parameters trained further on its task: the kernel method's end-to-end fine-tuning
(Karkhanis et al. §6.2), with a schedule and seeds of its own, apart from the one training loop (bench.loop)."""

from typing import List

import torch
from torch import nn

from bench.config import derive_seed, lr_at
from bench.tasks import Task, model_inputs, task_loss


def fine_tune(
    model: nn.Module,
    task: Task,
    parameters: List[nn.Parameter],
    steps: int,
    lr: float,
    weight_decay: float,
    batch_size: int,
    grad_clip: float,
    seed: int,
    log_every: int = 50,
) -> List[float]:
    """``parameters`` of a trained model trained ``steps`` more (the kernel method's §6.2): AdamW, a tenth of the
    steps' warm-up then cosine to 10%, batches and dropout from their own seeds. Returns the training losses."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    schedule = {"lr": lr, "warmup": steps // 10, "steps": steps, "lr_decay": "cosine", "lr_floor": 0.1}
    losses = []
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, schedule)
        torch.manual_seed(derive_seed(seed, "finetune", step))
        batch = task.train_batch(batch_size, torch.Generator().manual_seed(derive_seed(seed, "ft", step)))
        logits, _ = model(**model_inputs(batch, device))
        loss = task_loss(logits, batch["targets"].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            nn.utils.clip_grad_norm_(parameters, grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0:
            print(f"fine-tune step {step + 1}/{steps} | loss {sum(losses[-log_every:]) / log_every:.4f}", flush=True)
    model.eval()
    return losses
