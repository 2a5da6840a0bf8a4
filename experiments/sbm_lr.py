"""SBM-Transformer's learning rate: why its graph collapses under Adam at lr 3e-3, measured step by step.

The README's snippet model (two of its pre-LayerNorm `Block`s, no FFN; token and position embeddings) trained by Adam
on a fresh batch a step: ``copy`` (32 of 16 symbols, a separator, the same again; loss on the second copy) or
``recall`` (bench's scattered-key recall, 64 tokens). Each SBM layer records every step its density, memberships,
the STE's ∂L/∂P on the sampled edges (Eq. 9) and Adam's state on C and the node MLP; a JSON per run.

    python -m experiments.sbm_lr run --task recall --lr 3e-3 --out results/sbm-lr/runs
    python -m experiments.sbm_lr run --task copy --density-weight 1e-2 --density-from 150 --out results/sbm-lr/runs
    python -m experiments.sbm_lr table results/sbm-lr/runs
    python -m experiments.sbm_lr plot results/sbm-lr/runs results/sbm-lr/collapse.png recall-sbm-lr0.003-s0
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from baselines.full import FullAttention
from bench.files import write_atomic
from bench.tasks.base import IGNORE
from bench.tasks.synthetic import Recall
from sbm_transformer import SBMAttention

DEFAULTS = {"clusters": 16, "ste": "paper", "delta": 0.01, "eps": 1e-8, "warmup": 0}
SYMBOLS, COPY_LEN = 16, 32  # copy: 16 symbols + a separator; 32 to copy (chance: ln 16 = 2.77 nats)


class Block(nn.Module):  # the README's block: pre-LayerNorm around any attention of this repository
    def __init__(self, attn: nn.Module, dim: int):
        super().__init__()
        self.attn, self.norm = attn, nn.LayerNorm(dim)

    def forward(self, x, key_padding_mask=None, causal=False, generator=None):
        y, stats = self.attn(self.norm(x), key_padding_mask=key_padding_mask, causal=causal, generator=generator)
        return x + y, stats


class Model(nn.Module):
    def __init__(self, args, vocab: int, length: int, classes: int):
        super().__init__()
        dim = 64

        def attention():
            if args.attn == "full":
                return FullAttention(dim, 2, 32)
            return SBMAttention(dim, 2, 32, clusters=args.clusters, delta=args.delta, ste=args.ste)

        self.embed, self.position = nn.Embedding(vocab, dim), nn.Embedding(length, dim)
        self.blocks = nn.ModuleList(Block(attention(), dim) for _ in range(2))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)
        for table in (self.embed, self.position):  # N(0, 0.02²) as bench's backbone and the official code
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, tokens, generator=None):
        x = self.embed(tokens) + self.position.weight[: tokens.shape[1]]  # (B, N, dim)
        aux = 0.0
        for block in self.blocks:
            x, stats = block(x, causal=True, generator=generator)
            aux = aux + stats.get("aux_loss", 0.0)
        return self.head(self.norm(x)), aux


def copy_batch(batch: int, generator) -> dict:
    """[x, SEP, x] read causally: the targets are the next tokens of the second copy, IGNORE elsewhere."""
    x = torch.randint(SYMBOLS, (batch, COPY_LEN), generator=generator)
    seq = torch.cat([x, torch.full((batch, 1), SYMBOLS), x], 1)  # (B, 2L + 1)
    targets = torch.full((batch, 2 * COPY_LEN), IGNORE)
    targets[:, COPY_LEN:] = x
    return {"tokens": seq[:, :-1], "targets": targets}


def make_task(args):
    """(next batch, vocab, length, classes)."""
    if args.task == "copy":
        return (lambda g: copy_batch(args.batch_size, g)), SYMBOLS + 1, 2 * COPY_LEN, SYMBOLS
    recall = Recall()
    recall.setup(args.recall_len, args.seed, None)
    return (lambda g: recall.train_batch(args.batch_size, g)), recall.vocab_size, args.recall_len, recall.VALUES


def probe(layers) -> list:
    """Each SBM layer's graph of the step, its P and Q̂ kept with their gradients (retain_grad)."""
    graphs = [None] * len(layers)
    for i, layer in enumerate(layers):

        def sample_kept(*args, i=i, sample=layer.sample, **kwargs):
            graphs[i] = graph = sample(*args, **kwargs)
            if graph["prob"].requires_grad:  # a training step, not an evaluation under no_grad
                graph["prob"].retain_grad(), graph["x"].retain_grad()
            return graph

        layer.sample = sample_kept
    return graphs


def layer_record(layer: SBMAttention, graph: dict, optimizer) -> dict:
    """One SBM layer's state after a backward (before the step)."""
    mask, prob, grad = graph["mask"], graph["prob"].detach(), graph["prob"].grad
    edge_grad = grad[mask]  # ∂L/∂P on the sampled edges (Eq. 9; with λ's share when λ > 0)
    x = graph["x"].detach()
    logits = torch.logit(x.clamp(1e-7, 1 - 1e-7))
    record = {
        "density": mask.float().mean().item(),  # edges / (queries × keys), causal: at most ≈ 0.5
        "expected": ((prob + layer.delta).tril().sum() / mask.numel()).item(),  # E[density] (Eq. 8)
        "logit_mean": logits.mean().item(),
        "edge_grad_sum": edge_grad.sum().item(),  # > 0: descent lowers the sampled edges' probabilities
        "edge_grad_positive": (edge_grad > 0).float().mean().item(),
        "membership_grad": graph["x"].grad.mean().item(),  # ∂L/∂Q̂ averaged: < 0 raises memberships
    }
    named = {"centers": layer.centers, "mlp_w": layer.mlp_w, "mlp_b": layer.mlp_b, "qkv": layer.qkv.weight}
    for name, p in named.items():  # the SBM's own parameters, and the attention's qkv beside them
        state = optimizer.state.get(p, {})
        if "exp_avg" in state:  # Adam's step direction m/(√v + ε) and how consistent its sign is
            t = float(state["step"])
            m, v = state["exp_avg"] / (1 - 0.9**t), state["exp_avg_sq"] / (1 - 0.999**t)  # bias-corrected
            record[f"{name}_grad"] = p.grad.norm().item()
            record[f"{name}_sqrt_v"] = v.sqrt().mean().item()
            record[f"{name}_adam_ratio"] = (m.abs() / (v.sqrt() + optimizer.defaults["eps"])).mean().item()
    return record


def run(args) -> dict:
    torch.manual_seed(args.seed)
    next_batch, vocab, length, classes = make_task(args)
    model = Model(args, vocab, length, classes)
    layers = [b.attn for b in model.blocks if isinstance(b.attn, SBMAttention)]
    graphs = probe(layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, eps=args.eps)
    warmup = lambda step: min(1.0, (step + 1) / args.warmup) if args.warmup else 1.0
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    generator, steps, start = torch.Generator().manual_seed(args.seed), [], time.perf_counter()
    for step in range(args.steps):
        for layer in layers:  # λ/L per layer (§5.2), from density_from on
            layer.density_weight = args.density_weight / len(layers) if step >= args.density_from else 0.0
        batch = next_batch(generator)
        logits, aux = model(batch["tokens"], generator)
        targets = batch["targets"]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad()
        (loss + aux).backward()
        scored = targets != IGNORE
        accuracy = (logits.argmax(-1) == targets)[scored].float().mean().item()
        row = {"step": step, "loss": loss.item(), "accuracy": accuracy}
        # the state before this step's update: Adam's moments are the previous steps'
        row["layers"] = [layer_record(layer, g, optimizer) for layer, g in zip(layers, graphs)]
        steps.append(row)
        optimizer.step()
        schedule.step()
    tail = steps[-args.tail :]
    return {
        "config": vars(args),
        "final_loss": statistics.mean(r["loss"] for r in tail),
        "final_accuracy": statistics.mean(r["accuracy"] for r in tail),
        "seconds": time.perf_counter() - start,
        "steps": steps,
    }


def compact(record: dict) -> dict:
    """The per-step rows as columns, 4 significant digits: "loss", "accuracy" (steps,), "layers"[i][field] (steps,)."""
    rows, digits = record.pop("steps"), lambda v: None if v is None else float(f"{v:.4g}")  # None: no Adam state yet
    record["loss"], record["accuracy"] = ([digits(r[k]) for r in rows] for k in ("loss", "accuracy"))
    fields = rows[-1]["layers"][0].keys() if rows[-1]["layers"] else ()
    layers = range(len(rows[0]["layers"]))
    record["layers"] = [{k: [digits(r["layers"][i].get(k)) for r in rows] for k in fields} for i in layers]
    return record


def name_of(args) -> str:
    extra = "".join(f"-{k}{getattr(args, k)}" for k in DEFAULTS if getattr(args, k) != DEFAULTS[k])
    lam = f"-lambda{args.density_weight:g}" if args.density_weight else ""
    return f"{args.task}-{args.attn}-lr{args.lr:g}{lam}{extra}-s{args.seed}"


def per_layer(record: dict) -> str:
    """Each layer's density over the record's last steps, "layer 0, layer 1"."""
    tail = record["config"]["tail"]
    return ", ".join(f"{statistics.mean(layer['density'][-tail:]):.3f}" for layer in record["layers"]) or "—"


def table(folder: Path) -> str:
    """Markdown: per setting, the final loss (mean of the last steps) and density per seed."""
    groups = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        c = record["config"]
        key = (c["task"], c["attn"], c["lr"], c["density_weight"], *(c[k] for k in DEFAULTS))
        groups.setdefault(key, []).append(record)
    lines = [
        "| task | attention | lr | λ (from) | k | STE | δ | Adam ε | warm-up | seeds | loss per seed | density per layer |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, records in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        task, attn, lr, lam, k, ste, delta, eps, warm = key
        losses = " / ".join(f"{r['final_loss']:.2f}" for r in records)
        dens = " / ".join(per_layer(r) for r in records)
        when = f"{lam:g} ({records[0]['config']['density_from']})" if lam else "0"
        sbm = attn == "sbm"
        row = [task, attn, f"{lr:g}", *((when, str(k), ste, f"{delta:g}") if sbm else ("—",) * 4)]
        lines.append("| " + " | ".join(row + [f"{eps:g}", str(warm), str(len(records)), losses, dens]) + " |")
    return "\n".join(lines)


def positive_share(ys: list, width: int = 15) -> list:
    """The share of the last `width` steps with a positive value: Eq. 9's net push down on the graph."""
    return [statistics.mean(y > 0 for y in ys[max(0, i - width + 1) : i + 1]) for i in range(len(ys))]


PANELS = (  # (field, title, log scale)
    ("density", "sampled density", True),
    ("logit_mean", "membership logit mean (Eq. 6-7)", False),
    ("edge_grad_sum", "share of the last 15 steps with Σ ∂L/∂P > 0 (Eq. 9)", False),
    ("mlp_w_sqrt_v", "Adam's √v̂ on the node MLP", True),
    ("mlp_w_adam_ratio", "Adam's |m̂|/(√v̂ + ε) on the node MLP", False),
    ("loss", "task loss", False),
)


def plot(folder: Path, out: Path, names: list, last: int) -> None:
    """Each SBM layer of the named records (solid: layer 0, dashed: layer 1), the first `last` steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for color, name in enumerate(names):
        r = json.loads((folder / f"{name}.json").read_text())
        for ax, (key, title, log) in zip(axes.flat, PANELS):
            lines = [r[key]] if key == "loss" else [layer.get(key, []) for layer in r["layers"]]
            for i, ys in enumerate(lines):
                ys = [math.nan if y is None else y for y in ys[:last]]
                ys = positive_share(ys) if key == "edge_grad_sum" else ys
                ax.plot(ys, color=f"C{color}", ls=("-", "--")[i % 2], lw=1, label=name if i == 0 else None)
            ax.set_title(title, fontsize=9)
            ax.set_yscale("log" if log else "linear")
            ax.axhline(0.5, color="k", lw=0.4) if key == "edge_grad_sum" else None
    axes[0, 0].legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("step", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.sbm_lr", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train one model and write its record (JSON) into --out")
    r.add_argument("--task", choices=("copy", "recall"), default="copy", help="the task")
    r.add_argument("--attn", choices=("sbm", "full"), default="sbm", help="SBM or full attention in both blocks")
    r.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    r.add_argument("--steps", type=int, default=300, help="training steps")
    r.add_argument("--seed", type=int, default=0, help="seed of the model and the batches")
    r.add_argument("--batch-size", type=int, default=32, help="sequences a step")
    r.add_argument("--recall-len", type=int, default=64, help="recall's tokens (pairs: one per 8 tokens)")
    r.add_argument("--clusters", type=int, default=16, help="k, as the README's snippet")
    r.add_argument("--delta", type=float, default=DEFAULTS["delta"], help="δ, random edge exploration (§4.2)")
    r.add_argument("--ste", choices=("paper", "official"), default=DEFAULTS["ste"], help="the STE (Eq. 9 or hardtanh)")
    r.add_argument("--density-weight", type=float, default=0.0, help="λ of the regulariser (§5.2), split over layers")
    r.add_argument("--density-from", type=int, default=0, help="the step from which λ acts")
    r.add_argument("--eps", type=float, default=DEFAULTS["eps"], help="Adam's ε")
    r.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="linear warm-up steps (0: none)")
    r.add_argument("--tail", type=int, default=30, help="steps averaged for the final loss and density")
    r.add_argument("--out", type=Path, default=Path("runs/sbm-lr"), help="folder of the records")
    t = sub.add_parser("table", help="print the markdown table of the records in a folder")
    t.add_argument("folder", type=Path)
    p = sub.add_parser("plot", help="draw density, Eq. 9's gradient, memberships and loss of records")
    p.add_argument("folder", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("names", nargs="+", help="record names (file stems)")
    p.add_argument("--last", type=int, default=300, help="the steps drawn: the first LAST")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(args.folder))
    elif args.command == "plot":
        plot(args.folder, args.out, args.names, args.last)
    else:
        del args.command
        out = args.__dict__.pop("out")
        record = compact(run(args))
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{name_of(args)}.json"
        write_atomic(path, json.dumps(record, separators=(",", ":")).encode())
        print(
            f"{path}: loss {record['final_loss']:.3f}, density per layer {per_layer(record)}, {record['seconds']:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
