"""experiments/sbm_lr.py's plumbing (a few steps per task and attention, the record, the table) and the mechanism it
shows (Eq. 9's per-query sum)."""

import json

import pytest
import torch

import sbm_transformer as sbm
from experiments import sbm_lr


@pytest.mark.parametrize("task, attn", [("copy", "sbm"), ("recall", "full")])
def test_a_run_writes_its_record_and_the_table_reads_it(tmp_path, capsys, task, attn):
    argv = ["run", "--task", task, "--attn", attn, "--steps", "3", "--batch-size", "2", "--tail", "2"]
    assert sbm_lr.main([*argv, "--recall-len", "16", "--density-weight", "1e-2", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert len(record["loss"]) == 3 and record["config"]["task"] == task
    layers = record["layers"]  # one column per field and layer, a value per step
    if attn == "sbm":
        assert len(layers) == 2 and 0 < layers[0]["density"][-1] <= 1 and len(layers[1]["edge_grad_sum"]) == 3
        assert {"logit_mean", "membership_grad", "centers_adam_ratio", "mlp_w_sqrt_v"} <= set(layers[0])
    else:
        assert layers == []
    capsys.readouterr()
    assert sbm_lr.main(["table", str(tmp_path)]) == 0
    assert f"| {task} | {attn} | 0.003 |" in capsys.readouterr().out


def test_help_runs_nothing(capsys):
    with pytest.raises(SystemExit) as exit_:
        sbm_lr.main(["run", "--help"])
    assert exit_.value.code == 0 and "--density-from" in capsys.readouterr().out


def test_eq9_pushes_each_query_by_its_temperature_derivative():
    """The mechanism results/sbm-lr shows: on a query's sampled edges Eq. 9's ∂L/∂P_ij = ∂L/∂A_ij · S_ij sums to
    ∂L/∂τ_i, the derivative in the query's inverse temperature τ_i (scores τ_i·S_ij), so where the loss asks for
    flatter attention every sampled edge is pushed down; the official form (∂L/∂A_ij itself) sums to 0."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 12, 8).unbind(0)  # (B, H, N, D) each
    mask = (torch.rand(1, 2, 12, 12) < 0.4) | torch.eye(12, dtype=torch.bool)
    rows, target = mask.sum(-1, keepdim=True, dtype=torch.int32), torch.randn(1, 2, 12, 8)
    for ste, expected in (("paper", None), ("official", 0.0)):
        tau = torch.ones(1, 2, 12, 1, requires_grad=True)  # scales each query's scores
        prob = torch.rand(1, 2, 12, 12, requires_grad=True)
        y = sbm.dense_attention(q * tau, k, v, prob, mask, rows, 0.0, ste)
        (y - target).square().mean().backward()  # small: hardtanh of the official form is inactive
        per_query = prob.grad.masked_fill(~mask, 0).sum(-1)  # (B, H, N)
        want = tau.grad[..., 0] if expected is None else torch.zeros_like(per_query)
        torch.testing.assert_close(per_query, want, atol=1e-5, rtol=1e-4)
    assert tau.grad.abs().max() > 1e-3  # the temperature derivative itself is not zero
