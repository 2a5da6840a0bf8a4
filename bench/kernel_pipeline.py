"""The kernel pipeline of kernel_sparse.py (Karkhanis et al., shared/papers/003) on a trained dense teacher: §4.1
analysis, the kernel families and a predictor per layer (§4.2, Eq. 1), sparsified inference against τ, K and
depth (§5.2-§5.3, Fig. 5-6) with FLOPs counted from the entries computed (Table 3), and end-to-end fine-tuning
beside a dense control (§6.2). The method itself (kernels, predictor, attention) lives in kernel_sparse.py, which
calls ``run_pipeline`` from its main(); any trained bench.model backbone whose attentions are
KernelSparseAttention can be the teacher.
"""
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List

import torch
from torch import nn

from bench import measure
from bench.train import derive_seed, lr_at, model_inputs, task_loss
from kernel_sparse import (KernelConfig, KernelPredictor, analyse_layer, binary_targets, fit_predictor,
                           handcrafted_kernels, init_learned_kernels, install, layer_inputs, layer_summary,
                           standard_kernels, valid_pairs)


@torch.no_grad()
def attention_flops(model: nn.Module, inputs: dict) -> Dict[str, float]:
    """Forward FLOPs per example (bench.measure conventions) of the whole model, of its attention modules, and
    of their parts: projections, predictor and the core (the rest: scores, softmax, weighted sum on the entries
    computed, and building the mask)."""
    parts = {}
    for index, block in enumerate(model.blocks):
        parts.update({f"attn{index}": block.attn, f"qkv{index}": block.attn.qkv, f"out{index}": block.attn.out,
                      f"predictor{index}": block.attn.predictor})
    counts = measure.count_flops(lambda: model(**inputs), parts, root=model)
    examples = len(inputs["tokens"])

    def total(prefix):
        return sum(value for label, value in counts.items() if label.startswith(prefix)) / examples

    projections = total("qkv") + total("out")
    return {"model": counts["total"] / examples, "attention": total("attn"), "projections": projections,
            "predictor": total("predictor"), "core": total("attn") - projections - total("predictor")}


@torch.no_grad()
def mask_quality(model: nn.Module, batches, device, cfg: KernelConfig) -> Dict[str, float]:
    """The installed predictors' masks against the teacher's targets, on the teacher's own layer inputs (no
    error propagation): recall and precision of the target ones, and the attention mass inside the mask."""
    hit = ones = chosen = mass = rows = 0.0
    modes = [block.attn.mode for block in model.blocks]
    install(model, mode="dense")
    captured = layer_inputs(model, batches, device)
    for block, layer, mode in zip(model.blocks, captured, modes):
        block.attn.mode = mode
        for x, valid, causal in layer:
            probs = block.attn.attention_probs(x, valid, causal)
            target = binary_targets(probs, valid_pairs(valid, causal), cfg)
            mask = block.attn.predictor.bank.mask(block.attn.selected(x, valid, causal), valid, causal)
            hit, ones, chosen = hit + (mask & target).sum(), ones + target.sum(), chosen + mask.sum()
            mass, rows = mass + (probs * mask).sum(), rows + valid.sum() * probs.shape[1]
    return {"target_recall": float(hit / max(ones, 1)), "target_precision": float(hit / max(chosen, 1)),
            "mass_recall": float(mass / max(rows, 1))}


def sparse_result(model: nn.Module, evaluate, limit: int, inputs: dict, dense_flops: dict) -> dict:
    """Validation perplexity (per scored token), density, keys per query and FLOPs relative to the dense
    teacher of the model as installed."""
    result = evaluate("valid", limit)
    flops = attention_flops(model, inputs)
    n = inputs["tokens"].shape[1]
    return {"valid_ppl": math.exp(result["loss"]), "density": result["density"], "keys_per_query": result["density"] * n,
            "density_per_layer": result["density_per_layer"],
            **{f"{part}_flops_x_dense": flops[part] / dense_flops[part] for part in ("core", "attention", "model")},
            "flops": flops}


# ------------------------------------------------------------------------- §6.2 end-to-end fine-tuning
def fine_tune(model: nn.Module, task, config: dict, cfg: KernelConfig, seed: int, grad_clip: float,
              log_every: int = 50) -> List[float]:
    """§6.2: train the backbone with the predicted masks in place (masked path, deviation 7); the predictors are
    frozen. AdamW with the harness's warm-up and cosine schedule; returns the training losses."""
    device = next(model.parameters()).device
    modes = [block.attn.mode for block in model.blocks]
    install(model, mode="masked", layers=sum(mode != "dense" for mode in modes))
    backbone = [p for name, p in model.named_parameters() if ".predictor." not in name]
    optimizer = torch.optim.AdamW(backbone, lr=cfg.finetune_lr, weight_decay=config["weight_decay"])
    schedule = {"lr": cfg.finetune_lr, "warmup": cfg.finetune_steps // 10, "steps": cfg.finetune_steps,
                "lr_decay": "cosine", "lr_floor": 0.1}
    losses = []
    model.train()
    for step in range(cfg.finetune_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, schedule)
        torch.manual_seed(derive_seed(seed, "finetune", step))
        batch = task.train_batch(config["batch_size"], torch.Generator().manual_seed(derive_seed(seed, "ft", step)))
        logits, _ = model(**model_inputs(batch, device))
        loss = task_loss(logits, batch["targets"].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            nn.utils.clip_grad_norm_(backbone, grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0:
            print(f"fine-tune step {step + 1}/{cfg.finetune_steps} | loss {sum(losses[-log_every:]) / log_every:.4f}",
                  flush=True)
    model.eval()
    for block, mode in zip(model.blocks, modes):
        block.attn.mode = mode
    return losses


# -------------------------------------------------------------------------------------------- the pipeline
def run_pipeline(model: nn.Module, evaluate, task, config: dict, cfg: KernelConfig, out: Path, seed: int = 0,
                 grad_clip: float = 1.0) -> dict:
    """§4-§6 on a trained dense `model` (bench.model.Model whose attentions are KernelSparseAttention).
    `evaluate(split, limit)` returns the harness's evaluation dict; `task` gives training batches. Returns the
    record's additions and writes analysis.pt and finetuned.pt into `out` (main adds kernel_report.md)."""
    start, device = time.time(), next(model.parameters()).device
    causal, depth = model.cfg.head == "lm", len(model.blocks)
    limit, final_limit = config["eval_batches"], config["final_eval_batches"]
    generator = torch.Generator().manual_seed(seed)

    def train_batches(count, name):
        return [task.train_batch(config["batch_size"], torch.Generator().manual_seed(seed * 7919 + i + len(name)))
                for i in range(count)]

    model.eval()
    install(model, mode="dense")
    example = next(task.eval_batches("valid", config["batch_size"], 1))
    inputs = model_inputs(example, device)
    dense_flops = attention_flops(model, inputs)
    teacher = {split: evaluate(split, final_limit) for split in ("valid", "test")}
    record = {"config": asdict(cfg), "teacher": {"valid_ppl": math.exp(teacher["valid"]["loss"]),
                                                 "test_ppl": math.exp(teacher["test"]["loss"]), "flops": dense_flops}}
    print(f"teacher: valid ppl {record['teacher']['valid_ppl']:.3f} | test ppl {record['teacher']['test_ppl']:.3f}",
          flush=True)

    # §4.1: attention maps, binary targets and accumulated maps of the teacher on training data.
    batches = -(-cfg.analysis_sequences // config["batch_size"])
    captured = layer_inputs(model, train_batches(batches, "analysis"), device)
    data, maps = zip(*(analyse_layer(block.attn, layer, cfg) for block, layer in zip(model.blocks, captured)))
    del captured
    torch.save([{name: m.cpu() for name, m in layer.items()} for layer in maps], out / "analysis.pt")
    record["analysis"] = [layer_summary(d, m) for d, m in zip(data, maps)]

    # §4.2: the kernel families, a predictor per layer, fitted with Eq. 1 (and the per-kernel loss, §6.2).
    dim, heads = model.cfg.dim, model.cfg.heads
    max_len = model.blocks[0].attn.predictor.bank.max_len
    quality_batches = list(task.eval_batches("valid", config["batch_size"], 2))
    predictors, record["variants"] = {}, {}
    for variant in cfg.variants():
        family, loss = variant.split("/")
        layers = []
        for d in data:
            if family == "standard":
                bank = standard_kernels(max_len)
            elif family == "learned":
                bank = init_learned_kernels(max_len, cfg.learned_kernels, generator)
            else:
                bank = handcrafted_kernels(d, causal, max_len, cfg.handcrafted_k, generator=generator)
            torch.manual_seed(int(torch.randint(2 ** 31, (1,), generator=generator)))
            layers.append(KernelPredictor(dim, heads, bank, cfg.window, cfg.hidden, cfg.hidden_layers).to(device))
        fitted = time.time()
        losses = [fit_predictor(p, d, causal, loss, cfg, generator) for p, d in zip(layers, data)]
        predictors[variant] = layers
        install(model, layers, "sparse", select=cfg.select, threshold=cfg.threshold, top_k=cfg.top_k)
        result = sparse_result(model, evaluate, limit, inputs, dense_flops)
        result.update(mask_quality(model, quality_batches, device, cfg))
        record["variants"][variant] = {"train_loss": sum(losses) / len(losses), "train_loss_per_layer": losses,
                                       "kernels_per_layer": layers[0].bank.num_kernels, "fit_seconds": time.time() - fitted,
                                       **result}
        print(f"{variant}: predictor loss {record['variants'][variant]['train_loss']:.4f} | valid ppl "
              f"{result['valid_ppl']:.3f} | density {result['density']:.3f} | core FLOPs x dense "
              f"{result['core_flops_x_dense']:.3f}", flush=True)

    # §5.2, Fig. 5: perplexity and sparsity against the threshold τ and the top-K of the sweep variant.
    sweep = predictors[cfg.sweep]
    points = [("threshold", t) for t in cfg.thresholds] + [("topk", k) for k in cfg.top_ks]
    record["fig5"] = []
    for rule, value in points:
        install(model, sweep, "sparse", select=rule, threshold=value if rule == "threshold" else None,
                top_k=value if rule == "topk" else None)
        record["fig5"].append({"select": rule, "value": value, **sparse_result(model, evaluate, limit, inputs, dense_flops)})
    # §5.3, Fig. 6: sparsify the last ℓ layers only, ℓ = 0 (the teacher) … depth.
    record["fig6"] = []
    for layers in range(depth + 1):
        install(model, sweep, "sparse", layers=layers, select=cfg.select, threshold=cfg.threshold, top_k=cfg.top_k)
        result = evaluate("valid", limit)
        record["fig6"].append({"layers": layers, "valid_ppl": math.exp(result["loss"]), "density": result["density"]})

    # §6.2: fine-tune end to end at the sweep point of best perplexity within the FLOP budget (else the cheapest).
    within = [p for p in record["fig5"] if p["core_flops_x_dense"] <= cfg.flops_budget]
    point = min(within, key=lambda p: p["valid_ppl"]) if within else min(record["fig5"], key=lambda p: p["core_flops_x_dense"])
    rule = {"select": point["select"], "threshold": point["value"] if point["select"] == "threshold" else None,
            "top_k": point["value"] if point["select"] == "topk" else None}
    # The control: the same fine-tuning (steps, schedule, batches) with dense attention, from the same teacher,
    # so that the sparse model's perplexity is not credited with what more training of the teacher would give.
    control = None
    if cfg.finetune_steps > 0:
        teacher_backbone = {name: t.detach().clone() for name, t in model.state_dict().items()
                            if ".predictor." not in name}
        install(model, mode="dense")
        fine_tune(model, task, config, cfg, seed, grad_clip)
        control = {split: math.exp(evaluate(split, final_limit)["loss"]) for split in ("valid", "test")}
        with torch.no_grad():
            for name, t in model.state_dict().items():
                if name in teacher_backbone:
                    t.copy_(teacher_backbone[name])
        print(f"dense control fine-tuned {cfg.finetune_steps} steps: valid ppl {control['valid']:.3f} | test ppl "
              f"{control['test']:.3f}", flush=True)
    install(model, sweep, "sparse", **rule)
    losses = fine_tune(model, task, config, cfg, seed, grad_clip) if cfg.finetune_steps > 0 else []
    final = sparse_result(model, evaluate, final_limit, inputs, dense_flops)
    test = evaluate("test", final_limit)
    final.update({"test_ppl": math.exp(test["loss"]), "setting": {"variant": cfg.sweep, **rule},
                  "before_valid_ppl": point["valid_ppl"], "steps": cfg.finetune_steps,
                  "train_loss_last": sum(losses[-50:]) / max(1, len(losses[-50:]))})
    final["ppl_x_teacher"] = final["test_ppl"] / record["teacher"]["test_ppl"]
    final["valid_ppl_x_teacher"] = final["valid_ppl"] / record["teacher"]["valid_ppl"]
    final["target_met"] = final["core_flops_x_dense"] <= cfg.flops_budget and final["ppl_x_teacher"] <= 1.2
    if control is not None:
        final["dense_control"] = {"valid_ppl": control["valid"], "test_ppl": control["test"]}
        final["ppl_x_dense_control"] = final["test_ppl"] / control["test"]
    record["finetune"] = final
    torch.save({"model": model.state_dict(), "setting": final["setting"]}, out / "finetuned.pt")
    record["seconds"] = time.time() - start
    return {"kernel": record, "valid": math.log2(final["valid_ppl"]), "test": math.log2(final["test_ppl"]),
            "valid_loss": math.log(final["valid_ppl"]), "test_loss": math.log(final["test_ppl"]),
            "density": final["density"], "density_per_layer": final["density_per_layer"],
            "flops_per_example": {"model": final["flops"]["model"], "attention": final["flops"]["attention"]}}
