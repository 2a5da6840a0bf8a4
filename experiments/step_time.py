"""Training-step time of a table's methods side by side in one process, full attention timed as a user runs it.

    python -m experiments.step_time --task listops --preset paper --batch-size 8  # Table 3 at 2K
    python -m experiments.step_time --task listops --preset paper --batch-size 8 \
        --sbm-density results/sbm-table3/runs/sbm-lambda0.1-listops-paper-s0  # a run's density
    python -m experiments.step_time --task recall --runs 'results/matched-cost/runs/*-recall-cpu-s0' --exclude '*-lr*'

One model per variant, the same batches, a training step of each in turn, round after round:
- `full (as run)`: the preset's recipe (with attention dropout, CPU SDPA leaves its flash kernel for
  its math path), every batch padded to the preset's length;
- `full (fair)`: without attention dropout, each batch trimmed to its longest sequence;
- each other method of --methods untrained (its cost does not depend on its weights), SBM at each
  --sbm-density; or, with --runs, the settings of those run folders.
"""

import dataclasses
import inspect
import statistics
import sys
from pathlib import Path
from typing import Optional

import torch
from tabulate import tabulate

from bench import cli
from bench import methods as registry
from bench.config import PRESET_FIELDS, RunConfig, SetupError, derive_seed
from bench.files import read_json, write_json
from bench.loop import model_inputs, task_loss
from bench.measure import interleaved
from bench.model import Model, ModelConfig
from bench.tasks import default_data_dir, get_task


def trimmed(batch: dict) -> dict:
    """The batch cut to its longest sequence (its valid tokens are a prefix of each row)."""
    if batch.get("key_padding_mask") is None:
        return batch
    n = int((~batch["key_padding_mask"]).sum(1).max())
    return {k: (v[:, :n] if v.dim() > 1 and v.shape[1] == batch["tokens"].shape[1] else v) for k, v in batch.items()}


def shift_sbm(model: Model, inputs: dict, density: float) -> None:
    """Each SBM layer at expected density ``density`` (δ included) on what it sees of ``inputs``."""
    from sbm_transformer import at_density

    seen = {}
    hooks = [
        block.attn.register_forward_pre_hook(lambda m, args, i=i: seen.setdefault(i, args[0].detach()))
        for i, block in enumerate(model.blocks)
    ]
    with torch.no_grad():
        model(**inputs)
    for hook in hooks:
        hook.remove()
    for i, block in enumerate(model.blocks):
        at_density(block.attn, seen[i], density)


def sbm_densities(text: str) -> dict:
    """--sbm-density: label → density, from numbers ("sbm@1.10%") or run folders (their test density, "sbm λ=W")."""
    densities = {}
    for item in filter(None, text.split(",")):
        if Path(item).is_dir():
            record = read_json(Path(item) / "metrics.json")
            if not record or record.get("method") != "sbm" or record.get("density") is None:
                raise SetupError(f"--sbm-density: {item} holds no SBM record with a test density")
            densities[f"sbm λ={float(record['config'].get('density_weight') or 0):g}"] = record["density"]
        else:
            try:
                density = float(item)
            except ValueError:
                raise SetupError(f"--sbm-density: {item!r} is neither a density nor a run folder") from None
            if not 0 < density <= 1:
                raise SetupError(f"--sbm-density: {density} is not a density in (0, 1]")
            densities[f"sbm@{density:.2%}"] = density
    return densities


def method_records(names: list, sbm_density: dict, cfg: RunConfig) -> dict:
    """--methods as records of untrained runs of the preset, SBM once per --sbm-density."""
    config = {"attn_dropout": cfg.attn_dropout, "pos_emb": cfg.pos_emb}
    records = {}
    for name in names:
        records.update(
            {label: {"method": "sbm", "config": config, "density": density} for label, density in sbm_density.items()}
            if name == "sbm"
            else {name: {"method": name, "config": config}}
        )
    return records


def runs_config(pattern: str, task, out: Optional[str], data_dir: Optional[str], exclude: list) -> tuple:
    """--runs: (RunConfig, {folder: record}) of the complete runs matching ``pattern`` and none of ``exclude``."""
    import glob

    records = {
        Path(f).name: read_json(Path(f) / "metrics.json")
        for f in sorted(glob.glob(pattern))
        if not any(Path(f).match(x) for x in exclude)
    }
    records = {name: r for name, r in records.items() if r and r.get("status") == "complete"}
    if not records:
        raise SetupError(f"--runs: no complete run matches {pattern!r}")
    first = next(iter(records.values()))["config"]
    model = [
        f
        for f in PRESET_FIELDS
        if f
        not in (
            "steps",
            "lr",
            "warmup",
            "eval_every",
            "eval_batches",
            "final_eval_batches",
            "eval_context",
            "attn_dropout",
            "pos_emb",
        )
    ]
    differ = [n for n, r in records.items() if r["task"] != task.name or any(r["config"][f] != first[f] for f in model)]
    if differ:
        raise SetupError(f"--runs: {', '.join(differ)} differ from the first run in task or model")
    return RunConfig(
        **{f: first[f] for f in PRESET_FIELDS},
        method="full",
        task=task.name,
        seed=first["seed"],
        out=out,
        data_dir=data_dir,
    ), records


def variants(cfg: RunConfig, task, records: dict, example: dict) -> dict:
    """label → (model, trimmed): each record's run rebuilt from one seed; SBM at its density."""
    model_cfg = ModelConfig.of(
        cfg, vocab_size=task.vocab_size, num_classes=task.num_classes, head=task.head, max_len=cfg.seq_len
    )
    built, full_cfg = {}, model_cfg
    for name, record in records.items():
        label, method = name.rsplit(f"-{task.name}-", 1)[0], registry.get(record["method"])
        if method.tasks is not None:
            continue  # a pipeline of its own (the kernel method): no one training step to time
        run_cfg = dataclasses.replace(
            model_cfg, attn_dropout=record["config"]["attn_dropout"], pos_emb=record["config"]["pos_emb"]
        )
        if method.script:  # a method file: its settings dataclass, as the record keeps it, through its own factory
            factory = method.module().make_attention_factory
            settings = inspect.signature(factory).parameters["cfg"].annotation
            kept = {
                f.name: record["config"][f.name]
                for f in dataclasses.fields(settings)
                if record["config"].get(f.name) is not None
            }
            make = factory(settings(**kept), cfg.dim, cfg.heads, cfg.head_dim, run_cfg.attn_dropout, cfg.depth)
        else:  # a baseline: its --attn budget
            make = registry.same_in_every_layer(method.load(), run_cfg, record["config"].get("attn") or {})
        torch.manual_seed(derive_seed(cfg.seed, "init"))
        model = Model(run_cfg, make)
        if record["method"] == "sbm":
            shift_sbm(model, model_inputs(example, torch.device("cpu")), record["density"])
        full = record["method"] == "full" and not record["config"].get("attn")  # a claim's cell may be "full-n64"
        built["full (as run)" if full else label] = (model, False)
        full_cfg = run_cfg if full else full_cfg
    if "full (as run)" in built:
        fair = dataclasses.replace(full_cfg, attn_dropout=0.0)
        torch.manual_seed(derive_seed(cfg.seed, "init"))
        built["full (fair)"] = (Model(fair, registry.same_in_every_layer(registry.get("full").load(), fair, {})), True)
    return built


def main(argv=None) -> int:
    p = cli.task_parser(
        "python -m experiments.step_time",
        __doc__.splitlines()[0],
        "folder for step_time.json (default: runs/step_time)",
    )
    p.add_argument("--methods", default="full,sbm", help="comma-separated registry names (full adds its fair row)")
    p.add_argument(
        "--sbm-density",
        default="0.011",
        metavar="D,...",
        help="SBM's density in every layer, one variant each: numbers, or run folders whose record's test "
        "density is taken (a trained model's)",
    )
    p.add_argument(
        "--runs",
        metavar="PATTERN",
        default=None,
        help="time the settings of the run folders matching this pattern (quoted: the tool expands it) "
        "instead of --methods: their task and model from the records, SBM at its test density",
    )
    p.add_argument("--exclude", metavar="PATTERN", action="append", default=[], help="skip --runs folders (repeats)")
    p.add_argument("--repeats", type=cli.positive_int, default=7, help="timed rounds (median)")
    p.add_argument("--warmup-iters", type=cli.positive_int, default=1, help="untimed rounds first")
    args = p.parse_args(argv)
    if args.device not in ("auto", "cpu"):  # the steps below run on the CPU: another device would be ignored
        p.error(f"--device {args.device}: this tool times training steps on the CPU only")
    names = [m for m in args.methods.split(",") if m]
    unknown = [m for m in names if m not in registry.available() or m == "kernel"]
    if unknown or not names:
        p.error(f"--methods: unknown or untimeable {unknown}; choose from {sorted(registry.available())}")
    overrides = {name: getattr(args, name) for name in PRESET_FIELDS}
    cfg = RunConfig.of(
        get_task(args.task).presets[args.preset],
        overrides,
        method="full",
        task=args.task,
        preset=args.preset,
        seed=args.seed,
        out=args.out,
        data_dir=args.data_dir,
        data_file=args.data_file,
        no_download=args.no_download,
    )
    task = get_task(cfg.task)
    with cli.one_line_errors():
        if args.runs:
            cfg, records = runs_config(args.runs, task, cfg.out, cfg.data_dir, args.exclude)  # their task and model
        else:
            densities = sbm_densities(args.sbm_density) if "sbm" in names else {}
            records = method_records(names, densities, cfg)
        task.setup(cfg.seq_len, cfg.seed, Path(cfg.data_dir) if cfg.data_dir else default_data_dir(), cfg.eval_context)
        batches = [
            task.train_batch(cfg.batch_size, torch.Generator().manual_seed(derive_seed(cfg.seed, i, "data")))
            for i in range(args.warmup_iters + args.repeats)
        ]
        built = variants(cfg, task, records, batches[0])

    def training_step(model, trim: bool, optimizer):
        def step(round_: int) -> float:  # the density the step computed
            used = trimmed(batches[round_]) if trim else batches[round_]
            model.train()
            torch.manual_seed(derive_seed(cfg.seed, round_))
            logits, stats = model(**model_inputs(used, torch.device("cpu")))
            (task_loss(logits, used["targets"]) + stats["aux_loss"]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(stats["density"].mean())

        return step

    timed = interleaved(
        {
            label: training_step(model, trim, torch.optim.AdamW(model.parameters(), lr=cfg.lr))
            for label, (model, trim) in built.items()
        },
        torch.device("cpu"),
        args.repeats,
        args.warmup_iters,
    )
    kernel = {}
    for label, (model, trim) in built.items():
        if label.startswith("full"):  # the SDPA kernel the last round's length takes
            q = torch.zeros(1, 1, (trimmed(batches[-1]) if trim else batches[-1])["tokens"].shape[1], 8)
            kernel[label] = {0: "math", 1: "flash"}.get(
                int(torch._fused_sdp_choice(q, q, q, None, model.cfg.attn_dropout, False)), "other"
            )
    as_run, fair = (timed[k].median if k in timed else None for k in ("full (as run)", "full (fair)"))
    rows = [
        [
            label,
            f"{t.median:.0f} [{min(t.ms):.0f}-{max(t.ms):.0f}]",
            *(f"{t.median / ref:.3f}" if ref else "–" for ref in (fair, as_run)),
            f"{statistics.mean(t.results):.2%}",
            kernel.get(label, "–"),
        ]
        for label, t in timed.items()
    ]
    masks = [b["key_padding_mask"] for b in batches if b.get("key_padding_mask") is not None]
    valid = statistics.mean(float((~m).sum(1).float().mean()) for m in masks) if masks else cfg.seq_len
    print(
        f"{cfg.task} ({cfg.preset} preset): a training step of batch {cfg.batch_size} padded to {cfg.seq_len} "
        f"(mean valid length {valid:.0f}), attention dropout {cfg.attn_dropout} as run, {torch.get_num_threads()} "
        f"threads; median [min-max] ms of {args.repeats} interleaved rounds"
    )
    print(
        tabulate(
            rows,
            headers=["variant", "step ms", "÷ full (fair)", "÷ full (as run)", "density computed", "CPU SDPA kernel"],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    path = cli.out_file(cfg.out or "runs/step_time", "step_time.json")
    write_json(
        path,
        {
            "settings": vars(args),
            "step_ms": {k: t.ms for k, t in timed.items()},
            "sdpa_kernel": kernel,
            "mean_valid_length": valid,
        },
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
