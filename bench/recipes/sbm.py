"""SBM-Transformer's recipe (sbm_transformer.py): its settings as options, the attention factory (the
regulariser split over layers), a check of the settings before anything runs, and in the record the per-layer,
per-head density profile of the test split (App. C, Fig. 5) and, when δ > 0 is dropped in evaluation, the test
metric and density with δ kept (what the model owes to δ's random edges)."""
from bench.recipes import Hooks, Plan, Recipe
from sbm_transformer import SBMConfig, density_profile, exploring_in_eval, make_attention_factory


def plan(cfg: SBMConfig, args, config: dict, task) -> Plan:
    make_attention_factory(cfg, 1, 1, 1, 0.0, config["depth"])(0)  # bad settings fail now, not at step 1

    def make_attention(model_cfg):
        return make_attention_factory(cfg, model_cfg.dim, model_cfg.heads, model_cfg.head_dim,
                                      model_cfg.attn_dropout, model_cfg.depth)

    def after_training(model, evaluate) -> dict:
        limit = config["final_eval_batches"]
        record = {**vars(cfg), "density": density_profile(model, evaluate, "test", limit)}
        if cfg.delta > 0 and not cfg.explore_in_eval:  # the test split again, δ's random edges kept
            with exploring_in_eval(model):
                explored = evaluate("test", limit)
            record["test_with_exploration"] = {"metric": explored["metric"], "density": explored["density"]}
        return {"sbm": record}

    return Plan(make_attention, Hooks(after_training=after_training))


RECIPE = Recipe(
    description="Train and evaluate SBM-Transformer (Cho et al., NeurIPS 2022) on one task.",
    config=SBMConfig, plan=plan, title="SBM-Transformer (defaults: the paper's Table 7 and §4)",
    profiles={"official": (SBMConfig.official, "the official code's choices: dense path, hardtanh STE, δ in "
                                               "eval, shared MLP")})
