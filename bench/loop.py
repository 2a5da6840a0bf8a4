"""The one training loop, shared by every method and task: a training script cut into plain functions.

    run = loop.setup(cfg, task, make_attention)   # device, run folder (resume), data, model, optimizer
    loop.train(run)                                # the steps; loop.train(run, until=s) stops before step s
    record = loop.final_record(run)                # final evaluations and measurements: metrics.json's shape
    loop.finish(run, record)                       # writes metrics.json, prints the final line

A method's own procedure goes around these calls in its file's ``main()``. AdamW (weight decay on matrices
only), warm-up then cosine or linear decay (config.lr_at), gradient clipping, bf16 autocast on CUDA. Step t
draws from seeds of (seed, rank, t), an evaluation from (seed, split): a resumed run ends as an uninterrupted one.
"""

import dataclasses
import datetime
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bench import files, measure
from bench.config import Diverged, RunConfig, SetupError, derive_seed, lr_at, resolve_device
from bench.model import Model, ModelConfig
from bench.tasks import IGNORE, DataError, Task, base_rate, default_data_dir, model_inputs, task_loss


@dataclass
class Run:
    """One process's share of a run: what setup made, and what the run has done (``done``, checkpointed)."""

    cfg: RunConfig
    task: Task
    model: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    amp: bool  # bf16 autocast (CUDA)
    world: int
    rank: int
    context: dict  # what --resume compares besides the config: processes, device type, bf16 autocast
    done: files.Progress = field(default_factory=files.Progress)
    started: float = field(default_factory=time.time)  # when this process took the run up
    eval_seconds: Optional[float] = None  # what one periodic evaluation took: the ETA's estimate of the rest
    memory: Optional[measure.PeakRSS] = None  # the CPU's peak-memory meter, from this process's first step
    lock: Optional[files.FolderLock] = None  # OUT/run.lock, held while the process lives

    @property
    def is_main(self) -> bool:  # the process that evaluates, logs, checkpoints and writes the record
        return self.rank == 0

    @property
    def step(self) -> int:
        return self.done.step

    def evaluate(self, split: str, limit: Optional[int], forward: Optional[Callable] = None) -> dict:
        return evaluate(
            self.model, self.task, split, limit, self.cfg.batch_size, self.device, self.cfg.seed, self.amp, forward
        )

    def say(self, text: str, log: Optional[dict] = None) -> None:
        """A progress line, and its record in log.jsonl (stamped with the time, ISO 8601 UTC)."""
        if self.is_main:
            print(text, flush=True)
            if log is not None:
                stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                with open(self.cfg.folder / "log.jsonl", "a") as f:
                    f.write(json.dumps({"time": stamp, **log}) + "\n")

    def progress(self) -> files.Progress:
        """What the run has done, up to now: wall time and peak memory include this process's."""
        peak = max(self.done.peak_memory_bytes, measure.peak_memory_bytes(self.device, self.memory))
        return dataclasses.replace(
            self.done, wall_time_s=self.done.wall_time_s + time.time() - self.started, peak_memory_bytes=peak
        )

    def save(self, name: str) -> None:
        files.save_checkpoint(
            self.cfg.folder / name,
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "progress": self.progress().state(),
                "config": self.cfg.as_record(),
                **self.context,
            },
        )


# ------------------------------------------------------------------------------------------------ setup
def setup(cfg: RunConfig, task: Task, make_attention: Callable[[ModelConfig], Callable[[int], nn.Module]]) -> Run:
    """Device, run folder (with --resume its checkpoint), data, model (with --init-from a checkpoint's weights),
    optimizer, processes; a bad setting is refused (SetupError) before anything is written.
    ``make_attention(model_cfg)``: the backbone's ``layer_index -> attention``."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    out = cfg.folder
    try:
        device = resolve_device(cfg.device)
        if device.type == "cuda" and world > 1:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        amp = device.type == "cuda" and not cfg.no_amp
        context = {"world_size": world, "device_type": device.type, "bf16_autocast": amp}
        saved = files.open_folder(cfg, context, device)
        model = build_model(cfg, task, device, make_attention)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    optimizer = torch.optim.AdamW(
        [
            {
                "params": [p for p in model.parameters() if p.ndim >= 2],
                "weight_decay": cfg.weight_decay,
            },  # weight decay on matrices only
            {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=cfg.lr,
    )
    run = Run(cfg, task, model, optimizer, device, amp, world, rank, context)
    start = saved or (files.load_checkpoint(Path(cfg.init_from), device) if cfg.init_from else None)
    try:
        if start is not None:
            model.load_state_dict(start["model"])
        if saved is not None:
            optimizer.load_state_dict(saved["optimizer"])
            run.done = files.Progress.of(saved["progress"])
    except (RuntimeError, KeyError, ValueError) as exc:
        where = out / "checkpoint.pt" if saved is not None else cfg.init_from
        raise SetupError(
            f"{'--resume' if saved is not None else '--init-from'}: {where} does not fit this model: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if run.is_main:
        out.mkdir(parents=True, exist_ok=True)
        run.lock = files.FolderLock(out, "run.lock", "run").__enter__()  # released when the process ends
        if not cfg.resume:  # again under the lock: another run may have finished here during this one's setup
            files.open_folder(cfg, context, device)
        files.begin(out, cfg.resume, run.step)
    run.memory = measure.PeakRSS() if device.type == "cpu" else None
    measure.reset_peak_memory(device)
    warm_only = (
        (
            f"; note: its {cfg.warmup} warm-up steps are not fewer than its {cfg.steps} steps, so the learning "
            f"rate stays below its peak"
        )
        if cfg.warmup >= cfg.steps > 0
        else ""
    )
    run.say(
        f"{cfg.method} on {task.name} ({cfg.preset} preset, seed {cfg.seed}): {cfg.steps} steps of batch "
        f"{cfg.batch_size}{f' in each of {world} processes' if world > 1 else ''} at length {cfg.seq_len}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{measure.device_name(device)}"
        + (f", resumed at step {run.step}" if run.step else "")
        + (f", from the weights of {cfg.init_from}" if cfg.init_from and not run.step else "")
        + f"; run folder {out}"
        + warm_only
    )
    return run


def build_model(cfg: RunConfig, task: Task, device: torch.device, make_attention: Callable) -> Model:
    """The task's data and the model, initialised from the seed. First, every layer's attention runs once on zeros
    of the task's length (the random state restored), so that a setting it refuses is refused before any data."""
    task.data_file, task.download_allowed = cfg.data_file, not cfg.no_download
    model_cfg = ModelConfig.of(
        cfg, vocab_size=task.vocab_size, num_classes=task.num_classes, head=task.head, max_len=cfg.seq_len
    )
    factory = make_attention(model_cfg)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            for layer in range(model_cfg.depth):
                factory(layer).to(device).train()(
                    torch.zeros(1, cfg.seq_len, cfg.dim, device=device), causal=task.head == "lm"
                )
    except (ValueError, RuntimeError) as exc:  # RuntimeError: a size the constructor cannot allocate
        raise ValueError(
            f"{cfg.method} cannot run task {cfg.task} with these settings: {str(exc).splitlines()[0]}"
        ) from None
    task.setup(cfg.seq_len, cfg.seed, Path(cfg.data_dir) if cfg.data_dir else default_data_dir(), cfg.eval_context)
    # the data set the vocabulary (duplicates: seq_len + 1); the attention depends on none of these fields
    model_cfg = dataclasses.replace(model_cfg, vocab_size=task.vocab_size, num_classes=task.num_classes)
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    return Model(model_cfg, factory).to(device)


# ------------------------------------------------------------------------------------------------ training
def train(run: Run, until: Optional[int] = None) -> None:
    """Steps up to ``until`` (default: the last), with progress lines, evaluations and checkpoints. Ctrl-C ends
    them in one line saying how to go on (cli.one_line_errors: exit 130)."""
    try:
        take_steps(run, until)
    except KeyboardInterrupt:
        go_on = (
            "continue with --resume"
            if (run.cfg.folder / "checkpoint.pt").exists()
            else "nothing saved yet; rerun to start again"
        )
        raise KeyboardInterrupt(f"interrupted at step {run.step}; {go_on}") from None


def take_steps(run: Run, until: Optional[int]) -> None:
    cfg, task, model, device = run.cfg, run.task, run.model, run.device
    trained = nn.parallel.DistributedDataParallel(model) if run.world > 1 else model
    stop = cfg.steps if until is None else min(until, cfg.steps)
    trained.train()
    window = []  # (loss, metric, density) of the steps since the last progress line
    done = run.done
    while done.step < stop:
        for group in run.optimizer.param_groups:
            group["lr"] = lr_at(run.step, vars(cfg))
        torch.manual_seed(derive_seed(cfg.seed, run.rank, run.step))
        batch = task.train_batch(
            cfg.batch_size, torch.Generator().manual_seed(derive_seed(cfg.seed, run.rank, run.step, "data"))
        )
        measure.synchronize(device)
        start = time.perf_counter()
        inputs, targets = model_inputs(batch, device), batch["targets"].to(device)
        try:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.amp):
                logits, stats = trained(**inputs)
        except ValueError as exc:  # a sampler refuses non-finite scores (fastrg.py): the activations overflowed
            finite = torch.tensor("must be finite" not in str(exc))  # another ValueError is no divergence
            stop_if_diverged(run, finite, f"the attention's input at step {run.step + 1}", run.step + 1)
            raise
        loss = task_loss(logits, targets)
        stop_if_diverged(run, (loss + stats["aux_loss"]).isfinite(), f"the loss of step {run.step + 1}", run.step + 1)
        run.optimizer.zero_grad(set_to_none=True)
        (loss + stats["aux_loss"]).backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        run.optimizer.step()
        measure.synchronize(device)
        done.step_times.append((time.perf_counter() - start) * 1e3)
        done.elapsed += done.step_times[-1] / 1e3
        done.step += 1
        with torch.no_grad():
            scored = targets != IGNORE
            window.append(
                (
                    loss.item(),
                    loss.item() / math.log(2)
                    if task.metric == "bpb"
                    else (logits.argmax(-1)[scored] == targets[scored]).float().mean().item(),
                    stats["density"].mean().item(),
                )
            )
            done.train_density.append(stats["density"].float().mean(-1).cpu())
        if run.is_main and (run.step % cfg.log_every == 0 or run.step == cfg.steps):
            report_progress(run, *map(np.mean, zip(*window)))
            window = []
        if run.step % cfg.eval_every == 0 or run.step == cfg.steps:
            if run.is_main:
                begun = time.time()
                result = run.evaluate("valid", cfg.eval_batches)
                run.eval_seconds = time.time() - begun
                run.say(
                    f"eval step {run.step}: valid {task.metric} {result['metric']:.4f} loss {result['loss']:.4f} "
                    f"density {result['density']:.3f}",
                    {"step": run.step, "split": "valid", "lr": lr_at(run.step - 1, vars(cfg)), **result},
                )
                run.save("checkpoint.pt")
            if run.world > 1:
                dist.barrier()
        if run.is_main and run.step in cfg.snapshot_at:
            run.save(f"checkpoint-{run.step}.pt")


def stop_if_diverged(run: Run, finite: torch.Tensor, what: str, step: int) -> None:
    """``what`` (a loss, the attention's input) not ``finite`` on some process: the run stops there, its record
    says so (exit 3), naming ``step`` as where it diverged."""
    finite = finite.detach().to(torch.int32).reshape(1)
    if run.world > 1:
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    if finite.item():
        return
    lr = lr_at(step - 1, vars(run.cfg))
    if run.is_main:
        files.record_divergence(run.cfg, step, lr, run.progress())
    raise Diverged(
        f"the run diverged: {what} is not finite (learning rate {lr:g}); recorded in {run.cfg.folder / 'metrics.json'}"
    )


def report_progress(run: Run, loss: float, metric: float, density: float) -> None:
    """The progress line and its log record (the means since the last); the ETA counts the evaluations left."""
    cfg, done = run.cfg, run.done
    median_ms = statistics.median(done.step_times[-cfg.log_every :])
    evaluations = (
        cfg.steps // cfg.eval_every - done.step // cfg.eval_every + 2 * cfg.final_eval_batches / cfg.eval_batches
    )
    eta = datetime.timedelta(
        seconds=round(median_ms * (cfg.steps - done.step) / 1e3 + (run.eval_seconds or 0) * evaluations)
    )
    lr = lr_at(done.step - 1, vars(cfg))
    run.say(
        f"step {done.step}/{cfg.steps} | loss {loss:.4f} | {'bpb' if run.task.metric == 'bpb' else 'acc'} "
        f"{metric:.4f} | density {density:.3f} | lr {lr:.2e} | {median_ms:.1f} ms/step | ETA {eta}",
        {
            "step": done.step,
            "split": "train",
            "loss": float(loss),
            "metric": float(metric),
            "density": float(density),
            "lr": lr,
        },
    )


# ------------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Task,
    split: str,
    limit: Optional[int],
    batch_size: int,
    device: torch.device,
    seed: int,
    amp: bool,
    forward: Optional[Callable] = None,
) -> dict:
    """The task metric on a split (accuracy, or bits per byte), the mean loss, density and computed pairs per layer.
    ``forward(model, inputs) -> (logits, stats)`` replaces the model's own (SSA's self-ensembles; no pairs: None)."""
    was_training = model.training
    model.eval()
    torch.manual_seed(derive_seed(seed, "eval", split))
    nll, correct, count, densities, pairs, target_counts = 0.0, 0, 0, [], [], torch.zeros(task.num_classes)
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
        pairs.append(stats["computed_pairs"].float().cpu() if "computed_pairs" in stats else None)
    model.train(was_training)
    if count == 0:
        raise DataError(f"{task.name}: the {split} split produced no scored targets")
    loss = nll / count
    density = torch.stack(densities).mean(0)  # (L, H)
    computed = None if any(p is None for p in pairs) else torch.stack(pairs).mean(0)  # (L, H)
    metric = loss / math.log(2) if task.metric == "bpb" else correct / count
    return {
        "metric": metric,
        "loss": loss,
        "density": density.mean().item(),
        "density_per_layer": density.mean(1).tolist(),
        "computed_pairs": computed.mean().item() if computed is not None else None,
        "computed_pairs_per_layer": computed.mean(1).tolist() if computed is not None else None,
        "scored": count,
        "base_rate": base_rate(target_counts, task.metric),
    }


# ------------------------------------------------------------------------------------------------ the record
def final_record(run: Run) -> Optional[dict]:
    """The results record (DESIGN.md): final evaluations, densities, FLOPs, memory, timings, provenance, every
    process's weights' fingerprint. A method adds its own entries before ``finish``. Other processes get None."""
    cfg, device, model, task = run.cfg, run.device, run.model, run.task
    done = run.progress()
    fingerprints = [files.parameter_fingerprint(model)] * run.world  # this one's; then every process's
    if run.world > 1:
        dist.all_gather_object(fingerprints, fingerprints[0])
    if not run.is_main:
        return None
    run.say(f"final evaluation: valid and test, up to {cfg.final_eval_batches} batches each ...")
    valid = run.evaluate("valid", cfg.final_eval_batches)
    test = run.evaluate("test", cfg.final_eval_batches)
    run.say("measuring FLOPs and memory ...")
    inputs = model_inputs(next(task.eval_batches("valid", min(4, cfg.batch_size), 1)), device)
    flops, inference_memory = measure.model_costs(model, inputs, device, lambda tag: derive_seed(cfg.seed, tag))
    trained = torch.stack(done.train_density) if done.train_density else None  # (steps, L)
    return {
        "status": "complete",
        "method": cfg.method,
        "task": cfg.task,
        "preset": cfg.preset,
        "seed": cfg.seed,
        "device": measure.device_name(device),
        "world_size": run.world,
        "metric": task.metric,
        "valid": valid["metric"],
        "test": test["metric"],
        "valid_loss": valid["loss"],
        "test_loss": test["loss"],
        "scored": {"valid": valid["scored"], "test": test["scored"]},
        "base_rate": test["base_rate"],
        **{key: test[key] for key in ("density", "density_per_layer", "computed_pairs", "computed_pairs_per_layer")},
        "train_density": trained.mean().item() if trained is not None else None,
        "train_density_per_layer": trained.mean(0).tolist() if trained is not None else None,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_example": flops["eval"],
        "train_flops_per_example": flops["train"],
        "flops_convention": "forward; 1 multiply-add = 2 FLOPs; bench/measure.py",
        "peak_memory_bytes": done.peak_memory_bytes if cfg.steps > 0 else None,
        "inference_memory_per_example_bytes": inference_memory // len(inputs["tokens"]),
        "peak_memory_kind": "CPU peak RSS above the pre-training baseline"
        if device.type == "cpu"
        else "cuda max_memory_allocated",
        "median_step_ms": statistics.median(done.step_times[5:] or done.step_times) if done.step_times else None,
        "steps": cfg.steps,
        "train_time_s": done.elapsed,
        "wall_time_s": None,  # finish() sets the whole run's
        "param_fingerprints": fingerprints,
        "versions": measure.versions(),
        "allocator": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ},
        "config": cfg.as_record(),
    }


def finish(run: Run, record: Optional[dict]) -> None:
    """The first process writes ``record`` to OUT/metrics.json and prints its final line; the processes end
    together. Weights that give a final loss not finite are a divergence, not a result."""
    losses = [record["valid_loss"], record["test_loss"]] if run.is_main else []
    stop_if_diverged(run, torch.tensor(all(map(math.isfinite, losses))), "the final evaluation's loss", run.step)
    if run.is_main:
        record["wall_time_s"] = run.progress().wall_time_s
        files.write_json(run.cfg.folder / "metrics.json", record)
        print(
            f"final: valid {run.task.metric} {record['valid']:.4f} | test {run.task.metric} {record['test']:.4f} | "
            f"density {record['density']:.3f} | {record['train_time_s']:.1f} s training, "
            f"{record['wall_time_s']:.1f} s in all | record {run.cfg.folder / 'metrics.json'}\ncompare: base rate "
            f"{record['base_rate']:.4f} (a model blind to its input)"
            + ("" if run.cfg.method == "full" else "; " + files.full_attention_beside(run.cfg)),
            flush=True,
        )
        run.lock.__exit__()  # a finished folder keeps no lock file
    if run.world > 1:
        dist.barrier()
        dist.destroy_process_group()
