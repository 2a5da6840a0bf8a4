"""The kernel method's experiments (Karkhanis et al., kernel_sparse.py) on one dense teacher: Table 1 for every kernel
family and loss, and again at matched keys per query (top-K, and τ calibrated per family); Tables 2-3's density and
FLOPs; Fig. 5 (the threshold τ and the top-K) and Fig. 6 (sparse layers from the last backwards, error propagation,
§5.3); §6.2's fine-tuning at Fig. 5's best point within a FLOP budget, beside a dense control. What it fits and
installs is kernel_sparse.py's (its --family/--loss choose the variant of Fig. 5-6 and the fine-tuning); here are the
comparisons and their measurement. metrics.json holds the fine-tuned sparse model's numbers, the pipeline's under
`kernel`; `python -m experiments.kernel_report DIR` renders it.

    python -m experiments.kernel_pipeline --task wikitext2                     # CPU preset, minutes on one core
    python -m experiments.kernel_pipeline --task wikitext2 --preset paper      # seq 512, RoBERTa-base sizes (GPU)
    python -m experiments.kernel_pipeline --task wikitext2 --resume --out DIR  # again on a trained teacher
    python -m experiments.kernel_pipeline --task bytes                         # a causal teacher
"""

import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

import kernel_sparse as ks
from bench import cli, fine_tune, loop, measure
from bench.tasks import get_task


def _floats(text: str) -> Tuple[float, ...]:
    return tuple(float(t) for t in text.split(",") if t)


def _ints(text: str) -> Tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t)


def _names(text: str) -> Tuple[str, ...]:
    return tuple(t for t in text.split(",") if t)


@dataclass
class PipelineConfig(ks.KernelConfig):
    """The method's settings and the experiments' (the paper's values where it gives them), each an option."""

    families: Tuple[str, ...] = field(
        default=ks.FAMILIES, metadata={"type": _names, "help": "kernel families to fit, comma-separated"}
    )
    losses: Tuple[str, ...] = field(
        default=ks.LOSSES, metadata={"type": _names, "help": "predictor losses to fit, comma-separated (as --loss)"}
    )
    matched_top_ks: Tuple[int, ...] = field(
        default=(1, 2, 3, 5), metadata={"type": _ints, "help": "Table 1 at matched density: top-K values"}
    )
    matched_keys: Tuple[float, ...] = field(
        default=(1.25, 2.5, 5.0, 10.0),
        metadata={"type": _floats, "help": "Table 1 at matched density: keys per query each family's τ is set to"},
    )
    thresholds: Tuple[float, ...] = field(
        default=(0.1, 0.3, 0.5, 0.7, 0.9), metadata={"type": _floats, "help": "Fig. 5 thresholds, comma-separated"}
    )
    top_ks: Tuple[int, ...] = field(
        default=(1, 2, 3, 5, 8), metadata={"type": _ints, "help": "Fig. 5 top-K values, comma-separated"}
    )
    flops_budget: float = field(
        default=0.6, metadata={"help": "fine-tune the Fig. 5 point of best perplexity with core FLOPs ≤ this × dense"}
    )

    def __post_init__(self):
        super().__post_init__()
        unknown = [f for f in self.families if f not in ks.FAMILIES] + [x for x in self.losses if x not in ks.LOSSES]
        if unknown or not self.families or not self.losses:
            raise ValueError(f"families must be in {ks.FAMILIES} and losses in {ks.LOSSES}, got {unknown}")
        if self.variant not in self.variants():
            raise ValueError(f"--family/--loss ({self.variant}) must be among the fitted variants {self.variants()}")
        if not all(math.isfinite(v) for v in [self.flops_budget, *self.thresholds, *self.matched_keys]):
            raise ValueError("flops_budget, thresholds and matched_keys must be finite")
        if min([*self.top_ks, *self.matched_top_ks], default=1) < 1:
            raise ValueError("top-K values must be >= 1")
        if min(self.matched_keys, default=1) <= 0:
            raise ValueError(f"matched_keys must be positive, got {self.matched_keys}")

    def variants(self) -> List[str]:
        """FAMILY/LOSS names of the fitted predictors, in table order."""
        return [f"{f}/{x}" for x in self.losses for f in self.families if not (f == "learned" and x != "max")]


def layer_summary(data: ks.LayerData, maps: dict) -> dict:
    """What the record keeps of the analysis, per head: target ones per query row, their share within 8 tokens
    of the diagonal, and the 5 offsets most often needed (Fig. 3's diversity in numbers)."""
    n = data.target.shape[-1]
    rows = data.valid.sum().clamp_min(1)
    diagonal = maps["targets_diagonal_raw"]  # (H, 2N−1) expected target ones per offset
    near = diagonal[:, n - 1 - 8 : n + 8].sum(1) / diagonal.sum(1).clamp_min(1e-9)
    return {
        "target_ones_per_row": (data.target.sum((0, 2, 3)) / rows).tolist(),
        "share_within_8": near.tolist(),
        "top_offsets": (maps["targets_diagonal"].topk(5, -1).indices - (n - 1)).tolist(),
    }


# FLOPs by part of each attention (Table 3); what the parts leave is the core: scores, softmax, weighted sum on the
# entries computed and building the (query, key) list, the products that sparsity can change.
PARTS = {"projections": ["qkv", "out"], "predictor": ["predictor"]}


def sparse_result(result: dict, flops: dict, dense_flops: dict, n: int, seconds_x_dense: float) -> dict:
    """A validation result of the model as installed: perplexity (per scored token), density, keys per query,
    FLOPs relative to the dense teacher's and inference wall-clock relative to the same model run dense
    (``seconds_x_dense``). Sparsity (§4.3.2) is reported as keys per query (density × N) and as INTERFACE.md's
    density."""
    return {
        "valid_ppl": math.exp(result["loss"]),
        "density": result["density"],
        "keys_per_query": result["density"] * n,
        "density_per_layer": result["density_per_layer"],
        **{f"{part}_flops_x_dense": flops[part] / dense_flops[part] for part in ("core", "attention", "model")},
        "time_x_dense": seconds_x_dense,
        "flops": flops,
    }


@torch.no_grad()
def mask_quality(model: nn.Module, inputs: List[dict], cfg: ks.KernelConfig) -> Dict[str, float]:
    """The installed predictors' masks against the teacher's targets, on the teacher's own layer inputs (no
    error propagation): recall and precision of the target ones, and the attention mass inside the mask."""
    hit = ones = chosen = mass = rows = 0.0
    sparse = [block.attn.sparse for block in model.blocks]
    ks.install(model, sparse=False)
    captured = ks.layer_inputs(model, inputs)
    for block, layer, was_sparse in zip(model.blocks, captured, sparse):
        block.attn.sparse = was_sparse
        for x, valid, causal in layer:
            probs = block.attn.attention_probs(x, valid, causal)
            target = ks.binary_targets(probs, ks.valid_pairs(valid, causal), cfg)
            mask = block.attn.predictor.bank.mask(block.attn.selected(x, valid, causal), valid, causal)
            hit, ones, chosen = hit + (mask & target).sum(), ones + target.sum(), chosen + mask.sum()
            mass, rows = mass + (probs * mask).sum(), rows + valid.sum() * probs.shape[1]
    return {
        "target_recall": float(hit / max(ones, 1)),
        "target_precision": float(hit / max(chosen, 1)),
        "mass_recall": float(mass / max(rows, 1)),
    }


def fit_variants(
    model: nn.Module,
    data: List[ks.LayerData],
    cfg: PipelineConfig,
    generator: torch.Generator,
    measured: Callable[[], dict],
    quality: List[dict],
) -> Tuple[dict, dict]:
    """§4.2-§5.2 for every FAMILY/LOSS variant: fit its predictors, install them with the selection rule and
    validate (``measured()``: the harness's validation result and FLOPs of the model as installed), beside the
    masks' recall of the teacher's targets on the batches ``quality``. Returns predictors and records."""
    predictors, records = {}, {}
    for variant in cfg.variants():
        started = time.time()
        predictors[variant], fit = ks.fit_predictors(model, data, variant, cfg, generator)
        fit["fit_seconds"] = time.time() - started
        ks.install(model, predictors[variant], select=cfg.select, threshold=cfg.threshold, top_k=cfg.top_k)
        records[variant] = result = {**fit, **measured(), **mask_quality(model, quality, cfg)}
        print(
            f"{variant}: predictor loss {result['train_loss']:.4f} | valid ppl {result['valid_ppl']:.3f} | "
            f"density {result['density']:.3f} | core FLOPs x dense {result['core_flops_x_dense']:.3f} | time x dense "
            f"{result['time_x_dense']:.2f}",
            flush=True,
        )
    return predictors, records


def selection(rule: str, value) -> dict:
    """install's keywords for the selection `rule` (§5.2: "threshold" τ or "topk" K) at `value`."""
    return {
        "select": rule,
        "threshold": value if rule == "threshold" else None,
        "top_k": value if rule == "topk" else None,
    }


def sweeps(
    model: nn.Module,
    predictors: List[ks.KernelPredictor],
    cfg: PipelineConfig,
    measured: Callable[[], dict],
    evaluate: Callable[[], dict],
) -> Tuple[List[dict], List[dict]]:
    """Fig. 5: the chosen variant against the threshold τ and the top-K; Fig. 6: its last ℓ layers sparse, the
    others dense, ℓ = 0 (the teacher) … depth (error propagation, §5.3)."""
    fig5, fig6 = [], []
    for rule, value in [("threshold", t) for t in cfg.thresholds] + [("topk", k) for k in cfg.top_ks]:
        ks.install(model, predictors, **selection(rule, value))
        fig5.append({"select": rule, "value": value, **measured()})
    for layers in range(len(model.blocks) + 1):
        ks.install(model, predictors, layers=layers, select=cfg.select, threshold=cfg.threshold, top_k=cfg.top_k)
        result = evaluate()
        fig6.append({"layers": layers, "valid_ppl": math.exp(result["loss"]), "density": result["density"]})
    return fig5, fig6


@torch.no_grad()
def calibrated_threshold(model: nn.Module, inputs: dict, keys: float, iterations: int = 16) -> float:
    """τ at which the installed predictors, in the sparse model on one batch (`inputs`: the model's keyword
    arguments), give `keys` keys per query (the mean over layers and heads): bisection, the keys falling as τ rises."""
    low, high = 0.0, 1.0
    for _ in range(iterations):
        middle = (low + high) / 2
        ks.install(model, select="threshold", threshold=middle)
        found = float(model(**inputs)[1]["density"].mean()) * inputs["tokens"].shape[1]
        low, high = (middle, high) if found > keys else (low, middle)
    return high


def matched(
    model: nn.Module,
    predictors: dict,
    cfg: PipelineConfig,
    inputs: List[dict],
    evaluate: Callable[[], dict],
) -> List[dict]:
    """Table 1 at matched density: each family's Eq. 1 predictors with the top-K kernels (K in --matched-top-ks) and
    with a threshold τ calibrated on the first of `inputs` to each of --matched-keys keys per query; the validation
    perplexity (``evaluate()``), keys per query and the masks' recall of the teacher's targets beside each."""
    # Ours: the paper compares the families at one threshold, where each family's coefficients set its own density;
    # Eq. 1 drives a kernel's α towards its precision, so families of wider kernels select less at any one τ.
    n, rows = inputs[0]["tokens"].shape[1], []
    for variant in [v for v in cfg.variants() if v.endswith("/max")]:
        ks.install(model, predictors[variant])
        rules = [("topk", k, None) for k in cfg.matched_top_ks]
        rules += [("threshold", calibrated_threshold(model, inputs[0], keys), keys) for keys in cfg.matched_keys]
        for rule, value, keys in rules:
            ks.install(model, **selection(rule, value))
            result = evaluate()
            rows.append(
                {
                    "variant": variant,
                    "select": rule,
                    "value": value,
                    "keys_target": keys,
                    "valid_ppl": math.exp(result["loss"]),
                    "keys_per_query": result["density"] * n,
                    "density": result["density"],
                    **mask_quality(model, inputs, cfg),
                }
            )
    return rows


def fine_tune_best(
    model: nn.Module,
    predictors: List[ks.KernelPredictor],
    fig5: List[dict],
    teacher: dict,
    cfg: PipelineConfig,
    tune: Callable[[], List[float]],
    measured: Callable[[], dict],
    test_ppl: Callable[[], float],
) -> dict:
    """§6.2: fine-tune the backbone end to end (``tune()``: the harness's steps) at the Fig. 5 point of best
    perplexity within the FLOP budget (else the cheapest), beside a dense control (the teacher fine-tuned alike, so
    that more training is not credited to the masks); the record says whether core FLOPs ≤ budget × dense and test
    perplexity ≤ 1.2 × the teacher's."""
    within = [p for p in fig5 if p["core_flops_x_dense"] <= cfg.flops_budget]
    point = min(within, key=lambda p: p["valid_ppl"]) if within else min(fig5, key=lambda p: p["core_flops_x_dense"])
    rule = selection(point["select"], point["value"])
    control = None
    if cfg.finetune_steps > 0:
        before = {name: t.detach().clone() for name, t in model.state_dict().items() if ".predictor." not in name}
        ks.install(model, sparse=False)
        tune()
        control = {"valid_ppl": measured()["valid_ppl"], "test_ppl": test_ppl()}
        model.load_state_dict(before, strict=False)
        print(
            f"dense control fine-tuned {cfg.finetune_steps} steps: valid ppl {control['valid_ppl']:.3f} | "
            f"test ppl {control['test_ppl']:.3f}",
            flush=True,
        )
    ks.install(model, predictors, **rule)
    # Ours: the sparse model is fine-tuned on the masked reference path, which tests show equals the edge list in
    # outputs and gradients; validation, test, FLOPs and times use the edge list.
    with ks.switched(model, path="reference"):
        losses = tune() if cfg.finetune_steps > 0 else []
    final = {
        **measured(),
        "test_ppl": test_ppl(),
        "setting": {"variant": cfg.variant, **rule},
        "before_valid_ppl": point["valid_ppl"],
        "steps": cfg.finetune_steps,
        "train_loss_last": sum(losses[-50:]) / max(1, len(losses[-50:])),
    }
    final["ppl_x_teacher"] = final["test_ppl"] / teacher["test_ppl"]
    final["valid_ppl_x_teacher"] = final["valid_ppl"] / teacher["valid_ppl"]
    final["target_met"] = final["core_flops_x_dense"] <= cfg.flops_budget and final["ppl_x_teacher"] <= 1.2
    if control is not None:
        final["dense_control"] = control
        final["ppl_x_dense_control"] = final["test_ppl"] / control["test_ppl"]
    return final


def pipeline(
    model: nn.Module,
    cfg: PipelineConfig,
    seed: int,
    train: List[dict],
    valid: List[dict],
    evaluate: Callable[[str, bool], dict],
    flops: Callable[[], dict],
    timed: Callable[[dict], dict],
    tune: Callable[[], List[float]],
    folder,
) -> dict:
    """(2)-(5) on the trained dense teacher, through the harness's callables: ``evaluate(split, final)`` the model as
    installed on --eval-batches (final: --final-eval-batches), ``flops()`` its FLOPs by part on the first of the
    `valid` batches, ``timed({name: fn})`` the calls' median seconds side by side, ``tune()`` the backbone's
    fine-tuning (§6.2). `train`: §4.1's batches. Writes analysis.pt and finetuned.pt into `folder`; returns the
    report that the record keeps under ``kernel``."""
    start, n = time.time(), valid[0]["tokens"].shape[1]
    model.eval()
    ks.install(model, sparse=False)
    dense = flops()  # the teacher's

    def forward(dense: bool) -> None:
        with torch.no_grad(), ks.switched(model, **({"sparse": False} if dense else {})):
            model(**valid[0])

    def measured(final: bool = False) -> dict:
        seconds = timed({d: lambda _, d=d: forward(d) for d in (False, True)})  # as installed, every layer dense
        return sparse_result(evaluate("valid", final), flops(), dense, n, seconds[False] / seconds[True])

    teacher = {f"{split}_ppl": math.exp(evaluate(split, True)["loss"]) for split in ("valid", "test")}
    print(f"teacher: valid ppl {teacher['valid_ppl']:.3f} | test ppl {teacher['test_ppl']:.3f}", flush=True)
    report = {"config": asdict(cfg), "teacher": {**teacher, "flops": dense}}
    data, maps = ks.analysis(model, train, cfg)  # (2)
    report["analysis"] = [layer_summary(d, m) for d, m in zip(data, maps)]
    torch.save([{name: m.cpu() for name, m in layer.items()} for layer in maps], folder / "analysis.pt")
    predictors, report["variants"] = fit_variants(
        model, data, cfg, torch.Generator().manual_seed(seed), measured, valid
    )
    report["matched"] = matched(model, predictors, cfg, valid, lambda: evaluate("valid", False))  # (3), (4)
    chosen = predictors[cfg.variant]
    report["fig5"], report["fig6"] = sweeps(model, chosen, cfg, measured, lambda: evaluate("valid", False))  # (4)
    test_ppl = lambda: math.exp(evaluate("test", True)["loss"])
    report["finetune"] = fine_tune_best(
        model, chosen, report["fig5"], teacher, cfg, tune, lambda: measured(True), test_ppl
    )
    torch.save({"model": model.state_dict(), "setting": report["finetune"]["setting"]}, folder / "finetuned.pt")
    return {**report, "seconds": time.time() - start}


def headline(final: dict) -> dict:
    """The record's own fields from the fine-tuned sparse model's numbers (perplexities as bits and nats)."""
    return {
        "valid": math.log2(final["valid_ppl"]),
        "test": math.log2(final["test_ppl"]),
        "valid_loss": math.log(final["valid_ppl"]),
        "test_loss": math.log(final["test_ppl"]),
        "density": final["density"],
        "density_per_layer": final["density_per_layer"],
        "flops_per_example": {"model": final["flops"]["model"], "attention": final["flops"]["attention"]},
    }


def in_proportion(kernel: PipelineConfig, steps: int, preset_steps: int, given) -> PipelineConfig:
    """A run shorter than its preset's that sets none of the pipeline's sizes takes them in proportion to its steps
    (rounded up), as it does its warm-up and final evaluation (bench/config.py); setting any keeps the others."""
    sizes = ("analysis_sequences", "predictor_steps", "finetune_steps")
    if not 0 < steps < preset_steps or set(given) & set(sizes):
        return kernel
    return replace(kernel, **{name: -(-getattr(kernel, name) * steps // preset_steps) for name in sizes})


def main(argv=None, prog: str = "python -m experiments.kernel_pipeline") -> int:
    """(1) A dense teacher on the shared loop, masked-LM (causal on bytes), then `pipeline`. The record is the
    fine-tuned sparse model's; kernel.teacher the teacher's."""
    about = "The kernel method's experiments (Karkhanis et al.): Table 1 for every family and loss, Fig. 5-6, §6.2"
    cfg, kernel = cli.parse(
        argv, "kernel", prog, about + " beside a dense control.", PipelineConfig, tasks=("wikitext2", "bytes")
    )
    kernel = in_proportion(kernel, cfg.steps, get_task(cfg.task).presets[cfg.preset].steps, cfg.given)
    with cli.one_line_errors():
        run = loop.setup(cfg, get_task(cfg.task), lambda m: lambda _: kernel.teacher_attention(m))
        loop.train(run)  # (1) the teacher: dense attention, masked-LM loss
        record, model = loop.final_record(run), run.model
        if record is not None:
            train = ks.analysis_batches(run.task, kernel.analysis_sequences, cfg.batch_size, cfg.seed)
            valid = [loop.model_inputs(b, run.device) for b in run.task.eval_batches("valid", cfg.batch_size, 2)]
            fixed = valid[0]  # the batch that FLOPs and times are measured on (Tables 1, 3)
            recipe = (kernel.finetune_steps, kernel.finetune_lr, cfg.weight_decay, cfg.batch_size, cfg.grad_clip)
            report = pipeline(
                model,
                kernel,
                cfg.seed,
                [loop.model_inputs(batch, run.device) for batch in train],
                valid,
                lambda split, final: run.evaluate(split, cfg.final_eval_batches if final else cfg.eval_batches),
                lambda: measure.attention_part_flops(model, lambda: model(**fixed), len(fixed["tokens"]), PARTS),
                lambda fns: {name: t.median for name, t in measure.interleaved(fns, run.device, 5).items()},
                lambda: fine_tune.fine_tune(model, run.task, ks.backbone_parameters(model), *recipe, cfg.seed),
                cfg.folder,
            )
            record.update(kernel=report, **headline(report["finetune"]))
        loop.finish(run, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
