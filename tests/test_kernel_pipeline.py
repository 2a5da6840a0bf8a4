"""Tests for experiments/kernel_pipeline.py, the kernel paper's comparisons on one teacher: its settings (the
method's and the variants, sweeps and matched densities) and their bad values, the short run's sizes, the τ that
Table 1 at matched density calibrates, and a tiny end-to-end run rendered by experiments.kernel_report."""

import json
import math

import pytest
import torch

import kernel_sparse as ks
from conftest import DATA, seeded
from experiments import kernel_pipeline as kp
from experiments import kernel_report
from test_kernel_sparse import L, tiny_model


def test_default_variants_are_every_family_and_loss_in_table_order():
    cfg = kp.PipelineConfig()
    assert cfg.variants() == [
        "standard/max",
        "handcrafted/max",
        "learned/max",
        "standard/per-kernel",
        "handcrafted/per-kernel",
    ]
    assert cfg.variant == "standard/max" and isinstance(cfg, ks.KernelConfig)


@pytest.mark.parametrize(
    "bad",
    [
        dict(families=("standard", "bogus")),
        dict(families=()),
        dict(losses=("l1",)),
        dict(losses=()),
        dict(family="learned", loss="per-kernel"),
        dict(families=("learned",)),  # --family standard is not among the fitted variants
        dict(losses=("per-kernel",)),  # nor is --loss max
        dict(window=4),  # the method's own settings are checked too
        dict(top_ks=(2, 0)),
        dict(matched_top_ks=(0,)),
        dict(matched_keys=(0.0,)),
        dict(thresholds=(float("nan"),)),
        dict(flops_budget=float("inf")),
    ],
)
def test_pipeline_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        kp.PipelineConfig(**bad)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--families", "standard,bogus"], "families"),
        (["--top-ks", "1,0"], "top-K"),
        (["--families", "learned"], "among the fitted variants"),
        (["--family", "learned", "--loss", "per-kernel"], "learned kernels: max only"),
        (["--sweep", "standard/max"], "unrecognized arguments: --sweep"),
        (["--task", "duplicates"], "argument --task: invalid choice: 'duplicates'"),
    ],
)
def test_cli_rejects_bad_settings(argv, message, capsys, tmp_path):
    # a data folder without data and no training: were the check missing, main() would return 1 at once
    # rather than exit 2 (and never start a real training run)
    cheap = ["--device", "cpu", "--data-dir", str(tmp_path / "none"), "--no-download", "--steps", "0"]
    with pytest.raises(SystemExit) as exit_info:
        kp.main(["--task", "wikitext2", "--out", str(tmp_path / "out"), *cheap, *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_help_runs_nothing_and_names_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        kp.main(["--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0 and list(tmp_path.iterdir()) == []
    assert text.startswith("usage: python -m experiments.kernel_pipeline ")
    assert all(flag in text for flag in ("--family", "--families", "--thresholds", "--matched-keys", "--flops-budget"))


@pytest.mark.parametrize("task", ["wikitext2", "bytes"])  # a masked-LM teacher, and a causal one
def test_pipeline_end_to_end_smoke(task, tmp_path, capsys):
    if not ((DATA / "wikitext-2" / "valid.txt").is_file() and (DATA / "wikitext-2" / "test.txt").is_file()):
        pytest.skip(f"no WikiText-2 in {DATA} (set SPARSE_ATTN_DATA)")
    out = tmp_path / "run"
    code = kp.main(
        [
            "--task",
            task,
            "--device",
            "cpu",
            "--data-dir",
            str(DATA),
            "--out",
            str(out),
            "--seq-len",
            "32",
            "--dim",
            "16",
            "--depth",
            "2",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--mlp-dim",
            "32",
            "--steps",
            "4",
            "--batch-size",
            "4",
            "--eval-every",
            "4",
            "--eval-batches",
            "1",
            "--final-eval-batches",
            "1",
            "--analysis-sequences",
            "8",
            "--predictor-steps",
            "3",
            "--predictor-batch",
            "2",
            "--predictor-rows",
            "8",
            "--finetune-steps",
            "2",
            "--thresholds",
            "0.5",
            "--top-ks",
            "2",
            "--handcrafted-k",
            "4",
            "--learned-kernels",
            "3",
            "--hidden",
            "8",
            "--matched-top-ks",
            "1",
            "--matched-keys",
            "2",
        ]
    )
    assert code == 0
    record = json.loads((out / "metrics.json").read_text())
    kernel = record["kernel"]
    assert set(kernel["variants"]) == set(kp.PipelineConfig().variants())
    assert len(kernel["analysis"]) == 2 and len(kernel["fig6"]) == 3 and len(kernel["fig5"]) == 2
    # consistency between independent evaluations of the same setting
    assert kernel["fig6"][0]["valid_ppl"] == pytest.approx(kernel["teacher"]["valid_ppl"], rel=1e-5)
    assert kernel["fig6"][0]["density"] == pytest.approx(1.0 if task == "wikitext2" else 33 / 64)  # causal: (N+1)/2N
    assert kernel["fig6"][-1]["valid_ppl"] == pytest.approx(kernel["variants"]["standard/max"]["valid_ppl"], rel=1e-5)
    assert kernel["fig5"][0]["valid_ppl"] == pytest.approx(kernel["variants"]["standard/max"]["valid_ppl"], rel=1e-5)
    rows = [*kernel["variants"].items(), *(("fig5", v) for v in kernel["fig5"]), ("finetune", kernel["finetune"])]
    for name, v in rows:  # learned kernels start near-empty (logits N(−4, 1)): 3 predictor steps may leave them so
        assert (0 <= v["density"] if name.startswith("learned") else 0 < v["density"]) and v["density"] <= 1
        assert math.isfinite(v["valid_ppl"]) and 0 < v["time_x_dense"] < math.inf
        assert v["keys_per_query"] == pytest.approx(v["density"] * 32)
    final = kernel["finetune"]
    control = final["dense_control"]  # the teacher fine-tuned as long, densely: the fair reference
    assert math.isfinite(control["test_ppl"]) and final["ppl_x_dense_control"] == pytest.approx(
        final["test_ppl"] / control["test_ppl"]
    )
    assert {(r["variant"], r["select"]) for r in kernel["matched"]} == {
        (v, rule) for v in kp.PipelineConfig().variants() if v.endswith("/max") for rule in ("topk", "threshold")
    }
    assert record["density"] == final["density"] and record["valid"] == pytest.approx(math.log2(final["valid_ppl"]))
    assert (out / "analysis.pt").is_file() and (out / "finetuned.pt").is_file()
    assert kernel_report.main([str(out)]) == 0  # the tables, generated from the record
    report = capsys.readouterr().out
    assert "Dense control" in report and f"model inference time {final['time_x_dense']:.2f} × dense" in report
    assert "core FLOPs × dense | model time × dense" in report and "Verdict (paper's order" in report
    assert "Fig. 5 (standard/max):" in report


def test_a_short_run_takes_the_pipeline_in_proportion_unless_it_sets_a_size():
    """A 20-step run of the 1000-step preset took ~10 minutes in its 128-sequence analysis and 300-step predictors
    and fine-tuning; now they scale with the steps, as the warm-up does, unless the command sets any of them."""
    kernel = kp.PipelineConfig()
    short = kp.in_proportion(kernel, 20, 1000, frozenset())
    assert (short.analysis_sequences, short.predictor_steps, short.finetune_steps) == (3, 6, 6)
    assert kp.in_proportion(kernel, 20, 1000, frozenset({"predictor_steps"})) == kernel
    assert kp.in_proportion(kernel, 1000, 1000, frozenset()) == kernel == kp.in_proportion(kernel, 0, 1000, set())


def test_calibrated_threshold_gives_the_keys_asked_for():
    """Table 1 at matched density: at τ from calibrated_threshold the sparse model attends to the keys per query
    asked for, within what one step of the selection moves (a few queries taking or leaving a kernel)."""
    model = tiny_model("token")
    inputs = {"tokens": torch.randint(20, (3, L), generator=seeded(1))}
    ks.install(model)
    tau = kp.calibrated_threshold(model, inputs, 4.0)
    ks.install(model, select="threshold", threshold=tau)
    keys = float(model(**inputs)[1]["density"].mean()) * L
    assert 0 < tau < 1 and 3.0 < keys <= 4.0
