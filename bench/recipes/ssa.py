"""SSA's recipe (ssa.py): its settings as options, the ALiBi decoder's preset change, a check that the task's
length takes the windows, the dense fine-tuning tail (+FT), and in the record the sampled sub-model's FLOPs and
density (the paper's training compute, Table 1) and the self-ensembled metrics (§3.5, Fig. 7)."""
from bench import measure
from bench.recipes import Hooks, Plan, Recipe
from ssa import (SSAConfig, ensemble_forward, ensemble_sizes, fine_tune_callback, fine_tune_start, layer_sigma,
                 make_attention_factory, sampling_in_eval)


def preset_changes(cfg: SSAConfig, task) -> dict:
    """App. B.1: the ALiBi decoder has no positional embeddings."""
    return {"pos_emb": False} if cfg.alibi and task.head == "lm" else {}


def plan(cfg: SSAConfig, args, config: dict, task) -> Plan:
    depth, causal = config["depth"], task.head == "lm"
    probe = make_attention_factory(cfg, 1, 1, 1, 0.0, depth)(depth - 1)
    windows = probe.num_windows(causal)  # fail now, not at step 1, on a setting the length cannot take
    probe.draw_sources(-(-config["seq_len"] // windows) * windows, causal)

    def make_attention(model_cfg):
        return make_attention_factory(cfg, model_cfg.dim, model_cfg.heads, model_cfg.head_dim,
                                      model_cfg.attn_dropout, model_cfg.depth)

    def after_training(model, evaluate) -> dict:
        first = depth - cfg.sampled_layers(depth)
        record = {"setting": cfg.name(depth) + ("+FT" if cfg.finetune_fraction > 0 else ""),
                  "finetune_fraction": cfg.finetune_fraction,
                  "sigma_per_layer": [layer_sigma(cfg, i, depth) if i >= first else None for i in range(depth)]}
        sampled_flops = {}

        def counted_sample(model, inputs):  # one sub-model as a training step draws it (evaluation is dense)
            out = {}
            with sampling_in_eval(model):
                sampled_flops.update(measure.model_flops_per_example(
                    model, lambda: out.setdefault("result", model(**inputs)), len(inputs["tokens"])))
            return out["result"]

        sampled = evaluate("valid", limit=1, forward=counted_sample)
        record["sampled_flops_per_example"] = sampled_flops  # the SSA paper's Table 1 compute (training)
        record["sampled_density"] = sampled["density"]
        if cfg.ensemble_samples:
            def ensemble_of(n):
                return lambda model, inputs: ensemble_forward(model, inputs, n)

            # Fig. 7: the metric against the number of sub-models, on the validation split
            record["ensemble_curve"] = {n: evaluate("valid", limit=config["final_eval_batches"],
                                                    forward=ensemble_of(n))["metric"]
                                        for n in ensemble_sizes(cfg.ensemble_samples)}
            record["ensemble_valid"] = record["ensemble_curve"][cfg.ensemble_samples]
            record["ensemble_test"] = evaluate("test", limit=config["final_eval_batches"],
                                               forward=ensemble_of(cfg.ensemble_samples))["metric"]
            record["ensemble_samples"] = cfg.ensemble_samples
        return {"ssa": record}

    on_step = fine_tune_callback(cfg.finetune_fraction) if cfg.finetune_fraction > 0 else None
    # --resume may change what acts only from the dense tail on (a branch of S-L4 into S-L4+FT, bench.ssa_table)
    # or after training
    later = {"finetune_fraction": lambda c: fine_tune_start(c["steps"], c["finetune_fraction"]),
             "ensemble_samples": lambda c: c["steps"]}
    return Plan(make_attention, Hooks(on_step=on_step, after_training=after_training, later_settings=later))


RECIPE = Recipe(description="Train and evaluate SSA (Hussain et al., KDD 2023) on one task.", config=SSAConfig,
                plan=plan, title="SSA: S<ℓ>-L<w> (locally biased) or S<ℓ>-U<x> (unbiased)",
                preset_changes=preset_changes)
