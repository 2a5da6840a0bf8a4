"""pytest-benchmark regression benchmarks (not part of the default test run: pytest.ini's testpaths is tests/).

    python -m pytest benchmarks --benchmark-only --benchmark-autosave        # save a baseline
    python -m pytest benchmarks --benchmark-only --benchmark-compare --benchmark-compare-fail=median:10%
    python -m pytest -q benchmarks --benchmark-disable --bench-small         # CI: every benchmark runs once

Sizes: attention at n ∈ {1024, 4096}, batch 1, 2 heads, head dim 32 (experiments.scaling's shapes); ``--bench-small``
swaps in n = 128 and tiny models so that a run with ``--benchmark-disable`` only checks that every benchmark
still executes. ``--bench-threads`` sets torch's intra-op threads (default 1: steady on a shared machine); the
thread count, torch version and glibc allocator settings are stored with each saved run (machine_info), since
timings are only comparable under the same ones.
"""

import os

import pytest
import torch

ALLOCATOR_KEYS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")


def pytest_addoption(parser):
    group = parser.getgroup("sparse-attention benchmarks")
    group.addoption(
        "--bench-small",
        action="store_true",
        help="tiny sizes (n = 128): a quick check that every benchmark runs, not a measurement",
    )
    group.addoption("--bench-threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")


def pytest_configure(config):
    threads = config.getoption("--bench-threads")
    if threads < 0:
        raise pytest.UsageError("--bench-threads must be >= 0")
    if threads:
        torch.set_num_threads(threads)


def pytest_generate_tests(metafunc):
    """Every benchmark that takes ``n`` runs at the measured lengths, or at n = 128 with --bench-small."""
    if "n" in metafunc.fixturenames:
        lengths = [128] if metafunc.config.getoption("--bench-small") else [1024, 4096]
        metafunc.parametrize("n", lengths, ids=[f"n{n}" for n in lengths])


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["allocator"] = {key: os.environ.get(key, "default") for key in ALLOCATOR_KEYS}
    machine_info["bench_small"] = config.getoption("--bench-small")


@pytest.fixture
def small(request) -> bool:
    return request.config.getoption("--bench-small")


@pytest.fixture
def attention_fwd_bwd(benchmark):
    """run(module, x, group): benchmark one forward+backward of an attention module (INTERFACE.md) on x, in
    training mode, with a seeded generator; the density it reports goes into the saved run's extra_info."""

    def run(module: torch.nn.Module, x: torch.Tensor, group: str) -> None:
        grad = torch.randn_like(x)
        generator = torch.Generator().manual_seed(0)
        module.train()

        def forward_backward():
            y, stats = module(x, generator=generator)
            y.backward(grad)
            return stats

        benchmark.group = group
        stats = benchmark(forward_backward)
        benchmark.extra_info["density"] = stats["density"].float().mean().item()

    return run
