"""baselines/hybrid.py: window heads beside adaptive heads, one attention of the interface. The contract fuzz
(tests/test_interface.py) covers the interface; here, that it is exactly its two parts."""

import subprocess
import sys

import pytest
import torch

from baselines.hybrid import HybridAttention, parse_budget

DIM, H, D = 16, 4, 8


@pytest.mark.parametrize(
    "adaptive, budget", [("reformer", "n_hashes=2;bucket_size=2"), ("moba", "block=2;topk=1"), ("sbm", "clusters=2")]
)
@pytest.mark.parametrize("causal", [False, True])
def test_the_output_is_the_sum_of_its_window_heads_and_its_adaptive_heads(adaptive, budget, causal):
    """y = local(x) + adaptive(x), the adaptive heads drawing from the generator first; the statistics side by side,
    the window heads first; an adaptive attention's aux_loss passed on."""
    attention = HybridAttention(DIM, H, D, adaptive=adaptive, adaptive_heads=1, density=0.3, budget=budget)
    x, pad = torch.randn(2, 9, DIM), torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 7:] = True
    y, stats = attention(x, pad, causal, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    y_adaptive, other = attention.adaptive(x, pad, causal, generator)  # the adaptive heads draw first
    y_local, local = attention.local(x, pad, causal, generator)
    torch.testing.assert_close(y, y_local + y_adaptive, rtol=0, atol=0)
    assert stats["density"].shape == (H,)
    torch.testing.assert_close(stats["density"], torch.cat([local["density"], other["density"]]))
    assert ("aux_loss" in stats) == ("aux_loss" in other)
    assert attention.local.heads == H - 1 and attention.adaptive.heads == 1


def test_every_head_adaptive_is_the_adaptive_attention_alone():
    attention = HybridAttention(DIM, H, D, adaptive="moba", adaptive_heads=H, budget="block=2;topk=1")
    x = torch.randn(2, 9, DIM)
    y, stats = attention(x)
    expected, alone = attention.adaptive(x)
    assert attention.local is None and torch.equal(y, expected) and torch.equal(stats["density"], alone["density"])


def test_the_budget_text_gives_the_adaptive_attention_its_typed_options():
    assert parse_budget("n_hashes=2;bucket_size=8") == {"n_hashes": 2, "bucket_size": 8}
    assert parse_budget("delta=0.5;self_loops=true;ste=official;") == {
        "delta": 0.5,
        "self_loops": True,
        "ste": "official",
    }
    assert parse_budget("") == {}
    attention = HybridAttention(DIM, H, D, adaptive="reformer", budget="n_hashes=3;bucket_size=4")
    assert (attention.adaptive.n_hashes, attention.adaptive.bucket_size) == (3, 4)


@pytest.mark.parametrize(
    "options, words",
    [
        ({"adaptive": "lsh"}, "adaptive must be one of"),
        ({"adaptive_heads": 0}, r"adaptive_heads must be in \[1, heads=4\]"),
        ({"adaptive_heads": 5}, r"adaptive_heads must be in \[1, heads=4\]"),
        ({"budget": "n_hashes"}, "budget items are key=value"),
        ({"budget": "buckets=2"}, "unexpected keyword argument 'buckets'"),
    ],
)
def test_bad_options_are_one_clear_error(options, words):
    with pytest.raises((ValueError, TypeError), match=words):
        HybridAttention(DIM, H, D, **options)


def test_a_training_run_takes_the_adaptive_budget_as_one_attn_option(tmp_path):
    """`--attn budget=n_hashes=1;bucket_size=4`: the option's value keeps its own '=' signs."""
    tiny = ["--task", "recall", "--seq-len", "16", "--dim", "16", "--heads", "2", "--head-dim", "8", "--mlp-dim", "16"]
    tiny += ["--depth", "1", "--batch-size", "2", "--steps", "2", "--eval-batches", "1", "--final-eval-batches", "1"]
    attn = ["--attn", "adaptive=reformer", "--attn", "density=0.25", "--attn", "budget=n_hashes=1;bucket_size=4"]
    command = [sys.executable, "-m", "bench.train", "--method", "hybrid", *tiny, *attn, "--out", str(tmp_path / "r")]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "bucket_size=4" in (tmp_path / "r" / "metrics.json").read_text()
