"""experiments.sbm_scaling's memory fit: peak = a + b·E over the module's densities, each round fitted apart, of the peak
and of the tensors' peak, beside fused SDPA and the explicit path (the measurements themselves: tests/test_bench_cli.py)."""

from experiments.sbm_scaling import line_fit, memory_fit


def test_line_fit_recovers_an_exact_line():
    assert line_fit([1.0, 2.0, 4.0], [5.0, 7.0, 11.0]) == (3.0, 2.0)


def test_memory_fit_gives_a_and_b_per_n_with_their_range_over_rounds_and_both_ratios():
    n, MiB = 64, 2**20
    rows = [
        {"method": "full", "n": n, "peak_bytes": 4 * MiB, "tensor_peak_bytes": 2 * MiB},
        {"method": "full-ref", "n": n, "peak_bytes": 40 * MiB, "tensor_peak_bytes": 36 * MiB},
    ]
    for density in (0.25, 0.5):
        edges = density * 2 * n * n  # batch 1, 2 heads
        rounds = [10 * MiB + 20 * edges, 12 * MiB + 16 * edges]  # round 1: a = 10 MiB, b = 20; round 2: 12, 16
        tensors = [6 * MiB + 12 * edges, 6 * MiB + 12 * edges]  # the tensors alone: a = 6 MiB, b = 12
        rows.append(
            {
                "method": f"sbm@{density:g}",
                "n": n,
                "density": density,
                "peak_bytes": rounds[0],
                "peak_rounds": rounds,
                "tensor_peak_bytes": tensors[0],
                "tensor_peak_rounds": tensors,
            }
        )
    rows.append({"method": "sbm@0.75", "n": n, "error": "timed out"})  # a failed cell is left out
    [line] = memory_fit(rows, [0.25, 0.5, 0.75], batch=1, heads=2)
    assert line[:8] == [
        n,
        "11.0 [10.0, 12.0]",
        "18.0 [16.0, 20.0]",
        "6.0 [6.0, 6.0]",
        "12.0 [12.0, 12.0]",
        "4.0",
        "2.0",
        "40.0",
    ]
    peak = 10 + 20 * 0.25 * 2 * n * n / MiB
    assert line[8] == f"{peak:.1f} ({peak / 4:.2f} / {peak / 40:.2f})" and line[10] == "–"
    assert memory_fit(rows[:3], [0.25], batch=1, heads=2) == []  # one density: no line
