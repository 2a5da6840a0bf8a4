"""The one training loop, shared by every method and task.

    python -m bench.train --method full --task duplicates [--steps N --seed S --out DIR ...]
    torchrun --nproc_per_node 2 -m bench.train --method full --task listops      # DDP (gloo on CPU, nccl on CUDA)

AdamW (weight decay on matrices only), linear warm-up then cosine (default) or linear decay to a floor (default
10% of the peak learning rate; ``--lr-decay linear --lr-floor 0.5`` is the SSA paper's App. B.1 schedule),
gradient clipping, bf16 autocast on CUDA, periodic evaluation, a progress line, a JSON-lines log
(``log.jsonl``), atomic checkpoints at each evaluation and ``--resume``, and the results record
``metrics.json`` (DESIGN.md) written atomically at the end.

Reproducibility: every random draw of step t — the batch, dropout, a method's sampled attention — comes from
seeds derived from (seed, rank, t), and each evaluation from (seed, step). A run killed and resumed from its
last checkpoint therefore ends with exactly the metrics of an uninterrupted one (tests/test_train.py).

Methods plug in two ways. A baseline is a class in the registry ``METHODS`` built with the interface's core
arguments plus ``--attn key=value`` budget options. A method file with its own procedures (SSA's fine-tuning
tail, SBM's regulariser settings) has a ``main(argv)`` that builds a parser with ``build_parser()``, adds its
options and calls ``run(args, make_attention=..., hooks=Hooks(...))``; ``--method NAME`` here delegates to it,
so ``python ssa.py --task T`` and ``python -m bench.train --method ssa --task T`` run the same code.
"""
import argparse
import dataclasses
import datetime
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bench import measure
from bench.model import Model, ModelConfig
from bench.tasks import IGNORE, TASKS, DataError, Preset, default_data_dir, get_task

METHODS = {
    "full": "baselines.full:FullAttention",
    "linear": "baselines.linear:LinearAttention",
    "linformer": "baselines.linformer:LinformerAttention",
    "performer": "baselines.performer:PerformerAttention",
    "nystromformer": "baselines.nystromformer:NystromAttention",
    "reformer": "baselines.reformer:ReformerAttention",
    "sbm": "sbm_transformer:SBMAttention",
    "ssa": "ssa:SSAttention",
    "kernel": "kernel_sparse:KernelSparseAttention",
}
PRESET_FIELDS = [f.name for f in dataclasses.fields(Preset)]
LOG_EVERY = 50
LR_DECAYS = ("cosine", "linear")


def available_methods() -> Dict[str, str]:
    """Registry entries whose module exists in this checkout."""
    return {name: target for name, target in METHODS.items()
            if importlib.util.find_spec(target.split(":")[0]) is not None}


def load_method(name: str):
    module_name, class_name = METHODS[name].split(":")
    module = importlib.import_module(module_name)
    return module, getattr(module, class_name)


class SetupError(RuntimeError):
    """A setting that cannot work (bad shapes, unknown option): reported as one line, exit 2."""


@dataclass
class Hooks:
    """What a method file can add to the loop.

    on_step(model, step, total_steps): called before every training step (SSA's dense fine-tuning tail).
    eval_forward(model, inputs) -> (logits, stats): replaces model(**inputs) in evaluation (self-ensembling).
    after_training(model, evaluate) -> dict: extra results merged into metrics.json; ``evaluate(split, limit,
    forward=None)`` returns {"metric", "loss", "density", ...} on the final weights.
    """
    on_step: Optional[Callable] = None
    eval_forward: Optional[Callable] = None
    after_training: Optional[Callable] = None


# ------------------------------------------------------------------------------------------------ CLI
def parse_attn_option(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--attn expects key=value, got {text!r}")
    key, value = text.split("=", 1)
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    return key, value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def unit_fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1], got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def build_parser(description: str = "Train and evaluate one method on one task.") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--method", default="full", help="attention method (registry name)")
    p.add_argument("--task", required=True, choices=sorted(TASKS), help="task to train on")
    p.add_argument("--preset", default="cpu", choices=["cpu", "paper"], help="task preset: sizes and recipe")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--out", default=None, help="output folder (default runs/METHOD-TASK-PRESET-sSEED)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--data-dir", default=None, help="data folder (default $SPARSE_ATTN_DATA or ./data)")
    p.add_argument("--data-file", default=None, help="bytes: any text file (split 90/5/5); enwik8: enwik8.zip or "
                   "the unzipped file; text/image: an archive or folder; retrieval: the folder of LRA's AAN TSV files")
    p.add_argument("--no-download", action="store_true", help="never download; fail with instructions instead")
    p.add_argument("--attn", action="append", type=parse_attn_option, default=[], metavar="KEY=VALUE",
                   help="budget option passed to the attention constructor (repeatable)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="gradient-norm clipping (0 = off)")
    p.add_argument("--lr-decay", choices=LR_DECAYS, default="cosine",
                   help="shape of the decay after warm-up, from the peak to the floor at the last step")
    p.add_argument("--lr-floor", type=unit_fraction, default=0.1, metavar="FRACTION",
                   help="learning rate at the last step, as a fraction of the peak")
    p.add_argument("--log-every", type=positive_int, default=LOG_EVERY, help="steps between progress lines")
    p.add_argument("--no-amp", action="store_true", help="disable bf16 autocast on CUDA")
    p.add_argument("--snapshot-at", type=positive_int, action="append", default=[], metavar="STEP",
                   help="also keep the checkpoint after STEP steps as OUT/checkpoint-STEP.pt, from which a run "
                        "that differs only later can --resume (repeatable)")
    group = p.add_argument_group("preset overrides (default: the preset's value)")
    group.add_argument("--seq-len", type=positive_int, help="sequence length")
    group.add_argument("--dim", type=positive_int, help="model width")
    group.add_argument("--depth", type=positive_int, help="number of layers")
    group.add_argument("--heads", type=positive_int, help="attention heads")
    group.add_argument("--head-dim", type=positive_int, help="dimension per head")
    group.add_argument("--mlp-dim", type=positive_int, help="MLP hidden width")
    group.add_argument("--dropout", type=float, help="dropout rate")
    group.add_argument("--attn-dropout", type=float, help="attention dropout rate")
    group.add_argument("--pos-emb", type=lambda s: s.lower() in ("1", "true", "yes"), metavar="BOOL",
                       help="learned positional embeddings")
    group.add_argument("--steps", type=non_negative_int, help="training steps (0: evaluate the untrained model)")
    group.add_argument("--batch-size", type=positive_int, help="batch size per process")
    group.add_argument("--lr", type=float, help="peak learning rate")
    group.add_argument("--weight-decay", type=float, help="AdamW weight decay")
    group.add_argument("--warmup", type=non_negative_int, help="linear warm-up steps")
    group.add_argument("--eval-every", type=positive_int, help="steps between evaluations and checkpoints")
    group.add_argument("--eval-batches", type=positive_int, help="batches per periodic evaluation")
    group.add_argument("--final-eval-batches", type=positive_int, help="batches per final evaluation")
    group.add_argument("--eval-context", type=non_negative_int, help="LM: context bytes between eval windows")
    return p


def resolve_config(args) -> dict:
    """Preset values overridden by the options given on the command line. An LM's evaluation context keeps
    its fraction of the window when only --seq-len is changed."""
    task = get_task(args.task)
    preset = dataclasses.asdict(task.presets[args.preset])
    if args.seq_len is not None and args.eval_context is None:
        preset["eval_context"] = preset["eval_context"] * args.seq_len // preset["seq_len"]
    for name in PRESET_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            preset[name] = value
    config = {k: v for k, v in vars(args).items() if k not in PRESET_FIELDS}
    config.update(preset)
    config["attn"] = dict(args.attn)
    return config


# ------------------------------------------------------------------------------------------------ helpers
def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of parts (stable across runs and platforms)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but CUDA is not available")
    return device


def lr_at(step: int, config: dict) -> float:
    """Linear warm-up to the peak, then a cosine or linear decay to floor × peak at the last step."""
    peak, warmup, total = config["lr"], config["warmup"], max(1, config["steps"])
    floor = config["lr_floor"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    remaining = 1 - progress if config["lr_decay"] == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return peak * (floor + (1 - floor) * remaining)


def model_inputs(batch: dict, device: torch.device) -> dict:
    inputs = {"tokens": batch["tokens"].to(device),
              "key_padding_mask": batch["key_padding_mask"].to(device) if "key_padding_mask" in batch else None}
    if "tokens2" in batch:
        inputs["tokens2"] = batch["tokens2"].to(device)
        inputs["key_padding_mask2"] = batch["key_padding_mask2"].to(device)
    return inputs


def task_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in float32 over scored positions (targets ≠ IGNORE)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def parameter_fingerprint(model: nn.Module) -> str:
    """sha256 of all parameters' bytes, in registration order: equal iff the weights are identical."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def make_baseline_factory(method: str, model_cfg: ModelConfig, budget: dict) -> Callable[[int], nn.Module]:
    _, cls = load_method(method)
    params = inspect.signature(cls).parameters
    unknown = sorted(set(budget) - set(params))
    if unknown:
        raise ValueError(f"{method} takes no option(s) {unknown}; its options: "
                         f"{[n for n in params if n not in ('dim', 'heads', 'head_dim', 'dropout')]}")
    kwargs = dict(budget)
    if "max_len" in params and "max_len" not in kwargs:
        kwargs["max_len"] = model_cfg.max_len
    return lambda layer: cls(model_cfg.dim, model_cfg.heads, model_cfg.head_dim, model_cfg.attn_dropout, **kwargs)


# ------------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model: nn.Module, task, split: str, limit: Optional[int], batch_size: int, device: torch.device,
             seed: int, amp: bool, forward: Optional[Callable] = None) -> dict:
    """The task metric on a split: accuracy, or bits per byte for LM tasks; also the mean loss and density
    (mean over batches, per layer and head). Random draws come from a seed fixed per (seed, split)."""
    was_training = model.training
    model.eval()
    torch.manual_seed(derive_seed(seed, "eval", split))
    nll, correct, count, densities = 0.0, 0, 0, []
    for batch in task.eval_batches(split, batch_size, limit):
        inputs, targets = model_inputs(batch, device), batch["targets"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits, stats = forward(model, inputs) if forward is not None else model(**inputs)
        logits = logits.float().reshape(-1, logits.shape[-1])
        flat = targets.reshape(-1)
        scored = flat != IGNORE
        nll += F.cross_entropy(logits, flat, ignore_index=IGNORE, reduction="sum").item()
        correct += (logits.argmax(-1)[scored] == flat[scored]).sum().item()
        count += scored.sum().item()
        densities.append(stats["density"].float().cpu())
    model.train(was_training)
    if count == 0:
        raise DataError(f"{task.name}: the {split} split produced no scored targets")
    loss = nll / count
    density = torch.stack(densities).mean(0)  # (L, H)
    metric = loss / math.log(2) if task.metric == "bpb" else correct / count
    return {"metric": metric, "loss": loss, "density": density.mean().item(),
            "density_per_layer": density.mean(1).tolist(), "scored": count}


# ------------------------------------------------------------------------------------------------ the run
def setup(args, make_attention: Optional[Callable]):
    """Resolved config, the task with its data, the model on its device (initialised from the seed)."""
    config = resolve_config(args)
    device = resolve_device(args.device)
    if device.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    task = get_task(args.task)
    if args.data_file is not None:
        task.data_file = args.data_file
    if args.no_download:
        task.download_allowed = False
    task.setup(config["seq_len"], args.seed, Path(args.data_dir) if args.data_dir else default_data_dir(),
               config["eval_context"])
    model_cfg = ModelConfig(vocab_size=task.vocab_size, num_classes=task.num_classes, head=task.head,
                            max_len=config["seq_len"], dim=config["dim"], depth=config["depth"],
                            heads=config["heads"], head_dim=config["head_dim"], mlp_dim=config["mlp_dim"],
                            dropout=config["dropout"], attn_dropout=config["attn_dropout"],
                            pos_emb=config["pos_emb"])
    torch.manual_seed(derive_seed(args.seed, "init"))
    factory = (make_attention(args, model_cfg) if make_attention is not None
               else make_baseline_factory(args.method, model_cfg, config["attn"]))
    return config, task, Model(model_cfg, factory).to(device), model_cfg


def run(args, make_attention: Optional[Callable] = None, hooks: Optional[Hooks] = None) -> dict:
    """Trains and evaluates; returns the results record (also written to OUT/metrics.json by rank 0).

    make_attention(args, model_cfg) -> (layer_index -> nn.Module) builds a method's attention; without it
    the registry's class for ``args.method`` is built with the ``--attn`` options."""
    hooks = hooks or Hooks()
    try:
        config, task, model, model_cfg = setup(args, make_attention)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    device = next(model.parameters()).device
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    is_main = rank == 0
    amp = device.type == "cuda" and not args.no_amp
    out = Path(args.out or f"runs/{args.method}-{args.task}-{args.preset}-s{args.seed}")
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config["lr"])
    step, elapsed, step_times = 0, 0.0, []
    ckpt_path, log_file = out / "checkpoint.pt", out / "log.jsonl"
    if args.resume:
        if not ckpt_path.exists():
            raise DataError(f"--resume: no checkpoint at {ckpt_path}")
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step, elapsed, step_times = ckpt["step"], ckpt["elapsed"], list(ckpt["step_times"])
    if is_main and log_file.exists():
        # A fresh run starts a new log; a resumed one drops what was logged after its checkpoint.
        kept = [line for line in log_file.read_text().splitlines() if json.loads(line)["step"] <= step]
        log_file.write_text("".join(line + "\n" for line in kept) if args.resume else "")
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model

    def eval_split(split, limit, forward=None):
        return evaluate(model, task, split, limit, config["batch_size"], device, args.seed, amp,
                        forward if forward is not None else hooks.eval_forward)

    def log(record):
        if is_main:
            with open(log_file, "a") as f:
                f.write(json.dumps(record) + "\n")

    def training_state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "elapsed": elapsed, "step_times": step_times, "config": json.loads(json.dumps(config, default=str))}

    total = config["steps"]
    memory = measure.PeakRSS() if device.type == "cpu" else None
    measure.reset_peak_memory(device)
    trained.train()
    window_loss, window_metric, window_density = [], [], []
    while step < total:
        if hooks.on_step is not None:
            hooks.on_step(model, step, total)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        torch.manual_seed(derive_seed(args.seed, rank, step))
        batch = task.train_batch(config["batch_size"],
                                 torch.Generator().manual_seed(derive_seed(args.seed, rank, step, "data")))
        measure.synchronize(device)
        start = time.perf_counter()
        inputs, targets = model_inputs(batch, device), batch["targets"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits, stats = trained(**inputs)
        loss = task_loss(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        (loss + stats["aux_loss"]).backward()
        if args.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        measure.synchronize(device)
        step_times.append((time.perf_counter() - start) * 1e3)
        elapsed += step_times[-1] / 1e3
        step += 1
        with torch.no_grad():
            scored = targets != IGNORE
            window_loss.append(loss.item())
            window_metric.append(loss.item() / math.log(2) if task.metric == "bpb" else
                                 (logits.argmax(-1)[scored] == targets[scored]).float().mean().item())
            window_density.append(stats["density"].mean().item())
        if is_main and (step % args.log_every == 0 or step == total):
            median_ms = statistics.median(step_times[-args.log_every:])
            eta = datetime.timedelta(seconds=round(median_ms * (total - step) / 1e3))
            metric_name = "bpb" if task.metric == "bpb" else "acc"
            print(f"step {step}/{total} | loss {np.mean(window_loss):.4f} | {metric_name} "
                  f"{np.mean(window_metric):.4f} | density {np.mean(window_density):.3f} | "
                  f"{median_ms:.1f} ms/step | ETA {eta}", flush=True)
            window_loss, window_metric, window_density = [], [], []
        if step % config["eval_every"] == 0 or step == total:
            if is_main:
                result = eval_split("valid", config["eval_batches"])
                log({"step": step, "split": "valid", "lr": lr_at(step - 1, config),
                     **{k: v for k, v in result.items()}})
                print(f"eval step {step}: valid {task.metric} {result['metric']:.4f} loss {result['loss']:.4f} "
                      f"density {result['density']:.3f}", flush=True)
                save_atomic(ckpt_path, training_state())
            if world > 1:
                dist.barrier()
        if is_main and step in args.snapshot_at:
            save_atomic(out / f"checkpoint-{step}.pt", training_state())

    peak_memory = measure.peak_memory_bytes(device, memory) if total > 0 else None
    record = None
    fingerprints = [parameter_fingerprint(model)]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, fingerprints[0])
        fingerprints = gathered
    if is_main:
        valid = eval_split("valid", config["final_eval_batches"])
        test = eval_split("test", config["final_eval_batches"])
        example = next(task.eval_batches("valid", min(4, config["batch_size"]), 1))
        inputs = model_inputs(example, device)
        model.eval()
        with torch.no_grad():
            flops = measure.model_flops_per_example(model, lambda: model(**inputs), len(example["tokens"]))
        record = {
            "status": "complete", "method": args.method, "task": args.task, "preset": args.preset,
            "seed": args.seed, "device": device_name(device), "world_size": world,
            "metric": task.metric, "valid": valid["metric"], "test": test["metric"],
            "valid_loss": valid["loss"], "test_loss": test["loss"],
            "scored": {"valid": valid["scored"], "test": test["scored"]},
            "density": test["density"], "density_per_layer": test["density_per_layer"],
            "params": sum(p.numel() for p in model.parameters()),
            "flops_per_example": flops, "flops_convention": "forward; 1 multiply-add = 2 FLOPs; bench/measure.py",
            "peak_memory_bytes": peak_memory,
            "peak_memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else
                                "CPU peak RSS above the pre-training baseline",
            "median_step_ms": statistics.median(step_times[5:] or step_times) if step_times else None,
            "steps": total, "wall_time_s": elapsed,
            "param_fingerprints": fingerprints,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "numpy": np.__version__},
            "allocator": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
                          if k in os.environ},
            "config": json.loads(json.dumps(config, default=str)),
        }
        if hooks.after_training is not None:
            record.update(hooks.after_training(model, eval_split))
        write_json_atomic(out / "metrics.json", record)
        print(f"final: valid {task.metric} {record['valid']:.4f} | test {task.metric} {record['test']:.4f} | "
              f"density {record['density']:.3f} | {record['wall_time_s']:.1f} s | record {out / 'metrics.json'}",
              flush=True)  # the record's figures: an after-training hook may replace the dense evaluation's
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return record


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method", default="full")
    method = pre.parse_known_args(argv)[0].method
    methods = available_methods()
    if method not in methods:
        build_parser().error(f"argument --method: invalid choice {method!r} (available: {sorted(methods)})")
    module, _ = load_method(method)
    if hasattr(module, "main") and not module.__name__.startswith("baselines."):
        return module.main(argv)
    args = build_parser().parse_args(argv)
    return run_cli(args)


def run_cli(args, make_attention=None, hooks=None) -> int:
    """run() with bad input turned into one clear message: exit 1 for data problems, 2 for bad settings."""
    try:
        run(args, make_attention, hooks)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
