"""The one training loop, shared by every method and task: a training script cut into plain functions.

    run = loop.setup(cfg, task, make_attention)   # device, run folder (resume), data, model, optimizer
    loop.train(run)                                # the steps; loop.train(run, until=s) stops before step s
    record = loop.final_record(run)                # final evaluations and measurements: metrics.json's shape
    loop.finish(run, record)                       # writes metrics.json, prints the final line

A method's own procedure goes around these calls in its file's ``main()`` (SSA's dense tail between two
``train`` calls; SBM's density profile and the kernel pipeline after ``final_record``). AdamW (weight decay on
matrices only), warm-up then a cosine or linear decay (config.lr_at), gradient clipping, bf16 autocast on
CUDA, periodic evaluation with a checkpoint (bench/runs.py), a progress line and a JSON-lines log. Every random
draw of step t comes from seeds derived from (seed, rank, t), each evaluation's from (seed, split): a run
killed and resumed ends with exactly the metrics of an uninterrupted one. DDP under torchrun.
"""
import datetime
import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bench import measure, runs
from bench.config import Diverged, RunConfig, SetupError, derive_seed, lr_at, resolve_device
from bench.files import FolderLock, write_json
from bench.model import Model, ModelConfig
from bench.tasks import IGNORE, DataError, Task, default_data_dir


@dataclass
class Run:
    """One process's share of a run: what setup made, and what the loop advances."""
    cfg: RunConfig
    task: Task
    model: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    amp: bool  # bf16 autocast (CUDA)
    world: int
    rank: int
    context: dict  # what --resume compares besides the config: processes, device type, bf16 autocast
    step: int = 0
    elapsed: float = 0.0  # seconds of training steps
    step_times: List[float] = field(default_factory=list)  # ms per step
    train_density: List[torch.Tensor] = field(default_factory=list)  # (L,) per step: what each step computed
    memory: Optional[measure.PeakRSS] = None  # the CPU's peak-memory meter, from this process's first step
    earlier_peak: int = 0  # the peak memory of the steps before a resume
    lock: Optional[FolderLock] = None  # OUT/run.lock, held while the run lives

    @property
    def is_main(self) -> bool:  # the process that evaluates, logs, checkpoints and writes the record
        return self.rank == 0

    def evaluate(self, split: str, limit: Optional[int], forward: Optional[Callable] = None) -> dict:
        return evaluate(self.model, self.task, split, limit, self.cfg.batch_size, self.device, self.cfg.seed,
                        self.amp, forward)

    def log(self, record: dict) -> None:
        if self.is_main:
            with open(self.cfg.folder / "log.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def peak_memory(self) -> int:
        """The training steps' peak memory so far, over every resume."""
        return max(self.earlier_peak, measure.peak_memory_bytes(self.device, self.memory))

    def save(self, name: str) -> None:
        runs.save_checkpoint(self.cfg.folder / name, {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
            "elapsed": self.elapsed, "step_times": self.step_times, "peak_memory_bytes": self.peak_memory(),
            "train_density": torch.stack(self.train_density) if self.train_density else None,
            "config": self.cfg.as_record(), **self.context})


# ------------------------------------------------------------------------------------------------ setup
def setup(cfg: RunConfig, task: Task, make_attention: Callable[[ModelConfig], Callable[[int], nn.Module]],
          later: Optional[Dict[str, Callable[[dict], int]]] = None) -> Run:
    """Device, run folder (checked; with --resume its checkpoint loaded), data, model, optimizer, processes.
    ``make_attention(model_cfg)`` gives the backbone's ``layer_index -> attention``; ``later``: a method's
    settings that act only from a step on ({name: that step, from a config}), which --resume may change.
    Any bad setting is refused (SetupError) before the folder's old files go."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    out = cfg.folder
    try:
        device = resolve_device(cfg.device)
        if device.type == "cuda" and world > 1:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        amp = device.type == "cuda" and not cfg.no_amp
        context = {"world_size": world, "device_type": device.type, "bf16_autocast": amp}
        saved = runs.open_folder(cfg, context, later or {}, device)
        model = build_model(cfg, task, device, make_attention)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    run = Run(cfg, task, model, optimizer, device, amp, world, rank, context)
    if saved is not None:
        try:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise SetupError(f"--resume: {out / 'checkpoint.pt'} does not fit this model: "
                             f"{str(exc).splitlines()[0]}") from None
        run.step, run.elapsed, run.step_times = saved["step"], saved["elapsed"], list(saved["step_times"])
        run.earlier_peak = saved.get("peak_memory_bytes", 0)
        run.train_density = list(saved["train_density"]) if saved.get("train_density") is not None else []
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if run.is_main:
        out.mkdir(parents=True, exist_ok=True)
        run.lock = FolderLock(out, "run.lock", "run").__enter__()  # released when the process ends
        runs.begin(out, cfg.resume, run.step)
    run.memory = measure.PeakRSS() if device.type == "cpu" else None
    measure.reset_peak_memory(device)
    return run


def build_model(cfg: RunConfig, task: Task, device: torch.device, make_attention: Callable) -> Model:
    """The task with its data and the model on its device, initialised from the seed. Before any data are read,
    every layer's attention runs once on a zero sequence of the task's length (throwaway modules, the random
    state restored), so that a setting it refuses (a causal task for an attention with no causal form, a length it
    cannot take) is refused now."""
    if cfg.data_file is not None:
        task.data_file = cfg.data_file
    if cfg.no_download:
        task.download_allowed = False
    model_cfg = ModelConfig.of(cfg, vocab_size=task.vocab_size, num_classes=task.num_classes, head=task.head,
                               max_len=cfg.seq_len)
    factory = make_attention(model_cfg)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            for layer in range(model_cfg.depth):
                factory(layer).to(device).train()(torch.zeros(1, cfg.seq_len, cfg.dim, device=device),
                                                  causal=task.head == "lm")
    except ValueError as exc:
        raise ValueError(f"{cfg.method} cannot run task {cfg.task} with these settings: {exc}") from None
    task.setup(cfg.seq_len, cfg.seed, Path(cfg.data_dir) if cfg.data_dir else default_data_dir(), cfg.eval_context)
    # the data set the vocabulary (duplicates: seq_len + 1); the attention depends on none of these fields
    model_cfg = ModelConfig.of(cfg, vocab_size=task.vocab_size, num_classes=task.num_classes, head=task.head,
                               max_len=cfg.seq_len)
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    return Model(model_cfg, factory).to(device)


# ------------------------------------------------------------------------------------------------ training
def train(run: Run, until: Optional[int] = None) -> None:
    """Steps from the run's step to ``until`` (default: the last), with progress lines, periodic evaluations
    and checkpoints; each step's density of what it computed (SSA's sub-model, SBM's masks) is kept."""
    cfg, task, model, device = run.cfg, run.task, run.model, run.device
    trained = nn.parallel.DistributedDataParallel(model) if run.world > 1 else model
    stop = cfg.steps if until is None else min(until, cfg.steps)
    trained.train()
    window_loss, window_metric, window_density = [], [], []  # the steps since the last progress line
    while run.step < stop:
        for group in run.optimizer.param_groups:
            group["lr"] = lr_at(run.step, vars(cfg))
        torch.manual_seed(derive_seed(cfg.seed, run.rank, run.step))
        batch = task.train_batch(cfg.batch_size,
                                 torch.Generator().manual_seed(derive_seed(cfg.seed, run.rank, run.step, "data")))
        measure.synchronize(device)
        start = time.perf_counter()
        inputs, targets = model_inputs(batch, device), batch["targets"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.amp):
            logits, stats = trained(**inputs)
        loss = task_loss(logits, targets)
        if not all_finite(run, loss + stats["aux_loss"]):
            diverged(run)
        run.optimizer.zero_grad(set_to_none=True)
        (loss + stats["aux_loss"]).backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        run.optimizer.step()
        measure.synchronize(device)
        run.step_times.append((time.perf_counter() - start) * 1e3)
        run.elapsed += run.step_times[-1] / 1e3
        run.step += 1
        with torch.no_grad():
            scored = targets != IGNORE
            window_loss.append(loss.item())
            window_metric.append(loss.item() / math.log(2) if task.metric == "bpb" else
                                 (logits.argmax(-1)[scored] == targets[scored]).float().mean().item())
            window_density.append(stats["density"].mean().item())
            run.train_density.append(stats["density"].float().mean(-1).cpu())
        if run.is_main and (run.step % cfg.log_every == 0 or run.step == cfg.steps):
            report_progress(run, window_loss, window_metric, window_density)
            window_loss, window_metric, window_density = [], [], []
        if run.step % cfg.eval_every == 0 or run.step == cfg.steps:
            if run.is_main:
                result = run.evaluate("valid", cfg.eval_batches)
                run.log({"step": run.step, "split": "valid", "lr": lr_at(run.step - 1, vars(cfg)), **result})
                print(f"eval step {run.step}: valid {task.metric} {result['metric']:.4f} loss {result['loss']:.4f} "
                      f"density {result['density']:.3f}", flush=True)
                run.save("checkpoint.pt")
            if run.world > 1:
                dist.barrier()
        if run.is_main and run.step in cfg.snapshot_at:
            run.save(f"checkpoint-{run.step}.pt")


def all_finite(run: Run, loss: torch.Tensor) -> bool:
    """Whether every process's loss is finite."""
    finite = torch.isfinite(loss.detach()).to(torch.int32).reshape(1)
    if run.world > 1:
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite.item())


def diverged(run: Run) -> None:
    """A non-finite loss: the run stops there, its record says so (status "diverged", the step and learning rate),
    and the process ends with one line and exit 3."""
    lr = lr_at(run.step, vars(run.cfg))
    if run.is_main:
        write_json(run.cfg.folder / "metrics.json", {
            "status": "diverged", "method": run.cfg.method, "task": run.cfg.task, "preset": run.cfg.preset,
            "seed": run.cfg.seed, "diverged_at_step": run.step + 1, "lr": lr, "steps": run.cfg.steps,
            "wall_time_s": run.elapsed, "config": run.cfg.as_record()})
    raise Diverged(f"the run diverged: the loss of step {run.step + 1} is not finite (learning rate {lr:g}); "
                   f"recorded in {run.cfg.folder / 'metrics.json'}")


def report_progress(run: Run, losses: List[float], metrics: List[float], densities: List[float]) -> None:
    """The progress line and the log's training record: means over the steps since the last one."""
    total = run.cfg.steps
    median_ms = statistics.median(run.step_times[-run.cfg.log_every:])
    eta = datetime.timedelta(seconds=round(median_ms * (total - run.step) / 1e3))
    metric_name = "bpb" if run.task.metric == "bpb" else "acc"
    print(f"step {run.step}/{total} | loss {np.mean(losses):.4f} | {metric_name} {np.mean(metrics):.4f} | density "
          f"{np.mean(densities):.3f} | {median_ms:.1f} ms/step | ETA {eta}", flush=True)
    run.log({"step": run.step, "split": "train", "loss": float(np.mean(losses)), "metric": float(np.mean(metrics)),
             "density": float(np.mean(densities))})


def model_inputs(batch: dict, device: torch.device) -> dict:
    """A task's batch as the model's keyword arguments, on the device."""
    inputs = {"tokens": batch["tokens"].to(device),
              "key_padding_mask": batch["key_padding_mask"].to(device) if "key_padding_mask" in batch else None}
    if "tokens2" in batch:
        inputs["tokens2"] = batch["tokens2"].to(device)
        inputs["key_padding_mask2"] = batch["key_padding_mask2"].to(device)
    return inputs


def task_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in float32 over scored positions (targets ≠ IGNORE)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def fine_tune(model: nn.Module, task: Task, parameters: List[nn.Parameter], steps: int, lr: float,
              weight_decay: float, batch_size: int, grad_clip: float, seed: int, log_every: int = 50) -> List[float]:
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


# ------------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model: nn.Module, task: Task, split: str, limit: Optional[int], batch_size: int, device: torch.device,
             seed: int, amp: bool, forward: Optional[Callable] = None) -> dict:
    """The task metric on a split: accuracy, or bits per byte for LM tasks; also the mean loss and density
    (mean over batches, per layer and head). Random draws come from a seed fixed per (seed, split).
    ``forward(model, inputs) -> (logits, stats)`` replaces the model's own (SSA's self-ensembles)."""
    was_training = model.training
    model.eval()
    torch.manual_seed(derive_seed(seed, "eval", split))
    nll, correct, count, densities, target_counts = 0.0, 0, 0, [], torch.zeros(task.num_classes)
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
        target_counts += torch.bincount(flat[scored].cpu(), minlength=task.num_classes)
        densities.append(stats["density"].float().cpu())
    model.train(was_training)
    if count == 0:
        raise DataError(f"{task.name}: the {split} split produced no scored targets")
    loss = nll / count
    density = torch.stack(densities).mean(0)  # (L, H)
    metric = loss / math.log(2) if task.metric == "bpb" else correct / count
    return {"metric": metric, "loss": loss, "density": density.mean().item(),
            "density_per_layer": density.mean(1).tolist(), "scored": count,
            "base_rate": base_rate(target_counts, task.metric)}


def base_rate(counts: torch.Tensor, metric: str) -> float:
    """What a model with no input scores: the majority class's accuracy, or the unigram entropy in bits."""
    p = counts / counts.sum()
    if metric == "bpb":
        return -(p[p > 0] * p[p > 0].log2()).sum().item()
    return p.max().item()


# ------------------------------------------------------------------------------------------------ the record
def final_record(run: Run) -> Optional[dict]:
    """The results record (DESIGN.md): final evaluations, densities, FLOPs, memory, timings, provenance, every
    process's weights' fingerprint. A method adds its own entries before ``finish``. Other processes get None."""
    cfg, device, model, task = run.cfg, run.device, run.model, run.task
    peak_memory = run.peak_memory() if cfg.steps > 0 else None
    fingerprints = [runs.parameter_fingerprint(model)]
    if run.world > 1:
        gathered = [None] * run.world
        dist.all_gather_object(gathered, fingerprints[0])
        fingerprints = gathered
    if not run.is_main:
        return None
    valid = run.evaluate("valid", cfg.final_eval_batches)
    test = run.evaluate("test", cfg.final_eval_batches)
    inputs = model_inputs(next(task.eval_batches("valid", min(4, cfg.batch_size), 1)), device)
    flops, inference_memory = measure.model_costs(model, inputs, device, cfg.seed)
    trained = torch.stack(run.train_density) if run.train_density else None  # (steps, L)
    return {
        "status": "complete", "method": cfg.method, "task": cfg.task, "preset": cfg.preset, "seed": cfg.seed,
        "device": measure.device_name(device), "world_size": run.world,
        "metric": task.metric, "valid": valid["metric"], "test": test["metric"], "valid_loss": valid["loss"],
        "test_loss": test["loss"], "scored": {"valid": valid["scored"], "test": test["scored"]},
        "base_rate": test["base_rate"],
        "density": test["density"], "density_per_layer": test["density_per_layer"],
        "train_density": trained.mean().item() if trained is not None else None,
        "train_density_per_layer": trained.mean(0).tolist() if trained is not None else None,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_example": flops["eval"], "train_flops_per_example": flops["train"],
        "flops_convention": "forward; 1 multiply-add = 2 FLOPs; bench/measure.py",
        "peak_memory_bytes": peak_memory,
        "inference_memory_per_example_bytes": inference_memory // len(inputs["tokens"]),
        "peak_memory_kind": "CPU peak RSS above the pre-training baseline" if device.type == "cpu" else
                            "cuda max_memory_allocated",
        "median_step_ms": statistics.median(run.step_times[5:] or run.step_times) if run.step_times else None,
        "steps": cfg.steps, "wall_time_s": run.elapsed,
        "param_fingerprints": fingerprints,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
        "allocator": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ},
        "config": cfg.as_record(),
    }


def finish(run: Run, record: Optional[dict]) -> None:
    """The first process writes ``record`` to OUT/metrics.json and prints the final line (the record's figures:
    a method may have replaced the dense evaluation's); the processes end together."""
    if run.is_main:
        write_json(run.cfg.folder / "metrics.json", record)
        print(f"final: valid {run.task.metric} {record['valid']:.4f} | test {run.task.metric} {record['test']:.4f} | "
              f"density {record['density']:.3f} | {record['wall_time_s']:.1f} s | record "
              f"{run.cfg.folder / 'metrics.json'}", flush=True)
    if run.world > 1:
        dist.barrier()
        dist.destroy_process_group()
