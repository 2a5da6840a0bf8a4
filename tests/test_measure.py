"""bench/measure.py: FLOP formulas against hand counts, memory and time helpers."""

import os
import pathlib
import subprocess
import sys

import torch
import torch.nn.functional as F

from baselines.full import FullAttention
from bench import measure
from experiments import scaling
from bench.model import Model, ModelConfig


def flops(fn):
    return measure.count_flops(fn)["total"]


def test_matmul_is_two_flops_per_multiply_add():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    assert flops(lambda: a @ b) == 2 * 5 * 7 * 3


def test_cpu_sdpa_forward_and_backward_hand_counts():
    b, h, n, m, d = 2, 3, 16, 24, 8
    q = torch.randn(b, h, n, d, requires_grad=True)
    k, v = torch.randn(b, h, m, d, requires_grad=True), torch.randn(b, h, m, d, requires_grad=True)
    forward = 2 * 2 * b * h * n * m * d + measure.SOFTMAX_FLOPS_PER_ELEMENT * b * h * n * m  # QKᵀ, PV, softmax
    assert flops(lambda: F.scaled_dot_product_attention(q, k, v)) == forward
    out = F.scaled_dot_product_attention(q, k, v)
    # backward: S = QKᵀ recomputed (flash kernels keep no scores), dV = PᵀdO, dP = dO Vᵀ, dQ = dS K,
    # dK = dSᵀQ: 5 products, and a softmax backward
    backward = 5 * 2 * b * h * n * m * d + measure.SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT * b * h * n * m
    assert flops(lambda: out.sum().backward()) == backward + b * h * n * d  # + the sum's reduction


def test_reference_and_fast_full_attention_count_the_same_core():
    """Both paths of FullAttention do the same arithmetic; the reference also scales and masks the scores."""
    x = torch.randn(1, 32, 16)
    fast, reference = FullAttention(16, 2, 8, path="fast"), FullAttention(16, 2, 8, path="reference")
    n, h, d = 32, 2, 8
    scale = n * h * d  # the reference's division of Q by √D
    assert flops(lambda: reference(x)) == flops(lambda: fast(x)) + scale


def test_elementwise_reduction_and_scatter_conventions():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    assert flops(lambda: x * y) == 20
    assert flops(lambda: x.exp()) == 20
    assert flops(lambda: x.sum(-1)) == 20
    assert flops(lambda: torch.softmax(x, -1)) == measure.SOFTMAX_FLOPS_PER_ELEMENT * 20
    index = torch.tensor([0, 2, 2, 1])
    assert flops(lambda: torch.zeros(3, 5).index_add(0, index, x)) == 20
    assert flops(lambda: torch.zeros(3, 5).scatter_add(0, index[:, None].expand(4, 5), x)) == 20
    assert flops(lambda: x.gather(1, torch.zeros(4, 2, dtype=torch.long))) == 0
    assert flops(lambda: x[index]) == 0


def test_edge_list_attention_counts_like_its_dense_equivalent():
    """Scoring E pairs by gather + product + sum costs 2·E·D, what a dense product spends on E pairs."""
    e, d = 50, 8
    q, k = torch.randn(10, d), torch.randn(12, d)
    rows, cols = torch.randint(10, (e,)), torch.randint(12, (e,))
    assert flops(lambda: (q[rows] * k[cols]).sum(-1)) == 2 * e * d


def test_model_flops_split_attention_from_the_rest():
    cfg = ModelConfig(
        vocab_size=11, num_classes=3, head="cls", max_len=16, dim=16, depth=2, heads=2, head_dim=8, mlp_dim=32
    )
    model = Model(cfg, lambda i: FullAttention(16, 2, 8)).eval()
    tokens = torch.randint(11, (2, 16))
    with torch.no_grad():
        counts = measure.model_flops_per_example(model, lambda: model(tokens), 2)
    n, c, hd = 16, 16, 16
    projections = 2 * n * c * 3 * hd + 2 * n * hd * c  # qkv and out (addmm: the bias add is not counted)
    core = 2 * 2 * 2 * n * n * 8 + measure.SOFTMAX_FLOPS_PER_ELEMENT * 2 * n * n  # per layer, 2 heads
    # the density statistic adds 38 FLOPs of O(B·N) bookkeeping per layer and batch of 2: 38 per example
    assert counts["attention"] == 2 * (projections + core) + 38
    assert counts["model"] > counts["attention"]


def test_peak_rss_sees_an_allocation_after_the_baseline():
    # In a fresh process, as every measured cell runs: inside pytest the heap already holds freed, resident
    # pages from earlier tests (an allocation may reuse them without raising RSS), and where /proc/self/clear_refs
    # is not writable the lifetime peak of the earlier tests would hide the allocation.
    script = (
        "import torch\n"
        "from bench import measure\n"
        "meter = measure.PeakRSS()\n"
        "block = torch.ones(40 * 2 ** 20 // 4)\n"  # 40 MiB, touched
        "block += 1\n"
        "print(meter.peak_above_baseline())\n"
    )
    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) >= 35 * 2**20


def test_peak_rss_counts_memory_that_a_same_sized_warm_up_freed():
    # The benchmarks' allocator setting keeps freed memory resident; a warm-up of the same size as the measured
    # pass must not make the measured pass read ~0 (it did, before PeakRSS returned free heap pages).
    script = (
        "import torch\n"
        "from bench import measure\n"
        "warm = torch.ones(40 * 2 ** 20 // 4)\n"
        "del warm\n"
        "meter = measure.PeakRSS()\n"
        "block = torch.ones(40 * 2 ** 20 // 4)\n"
        "print(meter.peak_above_baseline())\n"
    )
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, **scaling.ALLOCATORS["keep"]}
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True, env=env)
    assert int(out.stdout.strip()) >= 35 * 2**20


def test_tensor_peak_counts_the_bytes_tensors_hold_at_once():
    """4 MiB and 2 MiB held together, then 4 MiB after both are freed: the peak is the 6 MiB held at once, not the
    10 allocated, and tensors that live before the call do not count."""
    before = torch.ones(1 << 22)

    def work():
        a = torch.ones(1 << 20)
        b = torch.ones(1 << 19)
        del a, b
        return torch.ones(1 << 20).sum()

    peak = measure.tensor_peak_bytes(work, torch.device("cpu"))
    assert 6 << 20 <= peak < (6 << 20) + (1 << 12), peak
    assert before.sum() == 1 << 22


def test_time_fn_returns_a_median_in_milliseconds():
    calls = []
    ms = measure.time_fn(lambda: calls.append(1), torch.device("cpu"), warmup=2, repeats=3)
    assert len(calls) == 5 and 0 <= ms < 100


def test_interleaved_calls_every_variant_once_a_round_and_times_the_rounds_after_the_warm_up():
    calls, rounds = [], []
    timed = measure.interleaved(
        {"a": lambda r: calls.append(("a", r)) or r, "b": lambda r: calls.append(("b", r))},
        torch.device("cpu"),
        repeats=3,
        warmup=1,
        alternate=True,
        after_round=rounds.append,
    )
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3)]
    assert rounds == [0, 1, 2, 3] and timed["a"].results == [1, 2, 3] and len(timed["b"].ms) == 3
    assert timed["a"].median == sorted(timed["a"].ms)[1] and min(timed["b"].ms) >= 0
