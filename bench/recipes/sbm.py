"""SBM-Transformer's recipe (sbm_transformer.py): its settings as options, the attention factory (the
regulariser split over layers), a check of the settings before anything runs, and the per-layer, per-head density
profile of the test split in the record (App. C, Fig. 5)."""
from bench.recipes import Hooks, Plan, Recipe
from sbm_transformer import SBMConfig, density_profile, make_attention_factory


def plan(cfg: SBMConfig, args, config: dict, task) -> Plan:
    make_attention_factory(cfg, 1, 1, 1, 0.0, config["depth"])(0)  # bad settings fail now, not at step 1

    def make_attention(model_cfg):
        return make_attention_factory(cfg, model_cfg.dim, model_cfg.heads, model_cfg.head_dim,
                                      model_cfg.attn_dropout, model_cfg.depth)

    def after_training(model, evaluate) -> dict:
        return {"sbm": {**vars(cfg), "density": density_profile(model, evaluate, "test",
                                                                  config["final_eval_batches"])}}

    return Plan(make_attention, Hooks(after_training=after_training))


RECIPE = Recipe(
    description="Train and evaluate SBM-Transformer (Cho et al., NeurIPS 2022) on one task.",
    config=SBMConfig, plan=plan, title="SBM-Transformer (defaults: the paper's Table 7 and §4)",
    profiles={"official": (SBMConfig.official, "the official code's choices: dense path, hardtanh STE, δ in "
                                               "eval, shared MLP")})
