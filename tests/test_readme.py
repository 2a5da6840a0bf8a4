"""The README's usage snippets run as written: every ```python block is executed in a fresh namespace (tiny
shapes, a second or two in all). Blocks that are not meant to run are fenced as ```bash or ```text."""

import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
# What the snippets must show, so that a block renamed out of ```python cannot pass unnoticed.
SHOWN = [
    "SBMAttention",
    'stats["aux_loss"]',
    "SSAttention",
    "KernelSparseAttention",
    "FullAttention",
    "LinearAttention",
    "LinformerAttention",
    "NystromAttention",
    "PerformerAttention",
    "ReformerAttention",
    "WindowAttention",
    "BigBirdAttention",
    "fastrg.sample",
    "key_padding_mask=padding",
    "causal=True",
    'stats["density"]',
    "torch.Generator()",
    "SSAttention(dim=64, heads=2, head_dim=32, unbiased=",
]


def test_the_snippets_show_every_method_and_argument():
    missing = [name for name in SHOWN if not any(name in block for block in BLOCKS)]
    assert not missing, f"no ```python block of README.md shows {missing}"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs(index, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's "sparse CSR support is in beta" notice
        exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out  # every snippet prints what it shows
