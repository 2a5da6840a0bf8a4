"""fastrg.sample at fixed expected densities (experiments.fastrg_bench's setting): n = m, K = 128 clusters,
memberships uniform(0, 1), S scaled so that Σλ / n² = d; the simple graph grouped by query (dedup, csr), the
form a sparse attention consumes."""

import pytest
import torch

import fastrg

K = 128
DENSITIES = [0.001, 0.01, 0.1]


@pytest.mark.parametrize("density", DENSITIES, ids=[f"d{d:g}" for d in DENSITIES])
def test_fastrg_sample(benchmark, n, density):
    g = torch.Generator().manual_seed(0)
    X, Y, S = torch.rand(n, K, generator=g), torch.rand(n, K, generator=g), torch.rand(K, K, generator=g)
    S = S * (density * n * n / float(fastrg.expected_edges(X, S, Y)))
    benchmark.group = f"fastRG sample, n={n}"
    row, *_ = benchmark(lambda: fastrg.sample(X, S, Y, generator=g, csr=True))
    benchmark.extra_info["edges"] = len(row)
