"""Shared test settings: where the real data live (SPARSE_ATTN_DATA, as CI sets it; else ../shared/data), one
intra-op thread per test, and seeded generators."""
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SPARSE_ATTN_DATA", ROOT.parent / "shared" / "data")).resolve()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny shapes gain nothing from intra-op threads, and lose much when other jobs share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
