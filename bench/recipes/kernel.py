"""The kernel method's recipe (kernel_sparse.py): its pipeline settings as options; the dense masked-LM teacher
trains through bench.train, then bench/kernel_pipeline.py runs as the after-training hook on the run's task and
writes kernel_report.md beside the record."""
from dataclasses import asdict

from bench import kernel_pipeline, kernel_report
from bench.recipes import Hooks, Plan, Recipe
from bench.train import run_folder
from kernel_sparse import KernelConfig, KernelSparseAttention

TEACHER = ("window", "hidden", "hidden_layers", "alibi")  # the settings that shape the teacher's attention


def plan(cfg: KernelConfig, args, config: dict, task) -> Plan:
    def make_attention(model_cfg):
        return lambda layer: KernelSparseAttention(
            model_cfg.dim, model_cfg.heads, model_cfg.head_dim, model_cfg.attn_dropout, max_len=model_cfg.max_len,
            window=cfg.window, hidden=cfg.hidden, hidden_layers=cfg.hidden_layers, mode="dense", alibi=cfg.alibi)

    def after_training(model, evaluate) -> dict:
        out = run_folder(args)
        result = kernel_pipeline.run_pipeline(model, evaluate, task, config, cfg, out, args.seed, args.grad_clip)
        (out / "kernel_report.md").write_text(kernel_report.render(result["kernel"]))
        return result

    # the pipeline's settings act after the teacher's training: --resume may change them (the teacher's own,
    # which shape its attention modules, must match)
    later = {name: (lambda c: c["steps"]) for name in asdict(cfg) if name not in TEACHER}
    return Plan(make_attention, Hooks(after_training=after_training, later_settings=later))


RECIPE = Recipe(description="Kernel-based learned sparse attention (Karkhanis et al.): dense teacher, §4.1 analysis, "
                            "kernel predictors, sparsified inference, end-to-end fine-tuning.",
                config=KernelConfig, plan=plan,
                title="kernel pipeline (defaults: the paper's values where it gives them)")
