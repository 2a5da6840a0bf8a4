"""What every command line of the harness shares: the help formatter, the option types and the output folder.
Standard library only, so that ``--help`` imports nothing heavy. The vocabulary (the same name for the same
thing in every entry point): --seq-len / --lengths, --batch-size, --heads, --head-dim, --methods / --method,
--tasks / --task, --seeds / --seed, --warmup (learning-rate warm-up steps only), --warmup-iters (untimed timing
iterations), --repeats, --threads, --device, --attn, --out DIR (always a folder), --data-dir.
"""
import argparse
from pathlib import Path
from typing import List


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """An option's default shown where it has one — never "(default: None)", "(default: False)" or
    "(default: [])": the help text says what an absent option means — and descriptions and epilogs (the preset
    tables of bench.train) as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if ("(default" in text or not action.option_strings or default is None or default is False
                or default == [] or default is argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def parser(prog: str, description: str, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose usage line is how a user calls the tool (``python -m bench.X``)."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter, **kwargs)


def device_option(text: str) -> str:
    """auto, cpu, cuda or cuda:N (whether CUDA is there is checked when the run starts)."""
    kind, _, index = text.partition(":")
    if text in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")


def positive_ints(text: str) -> List[int]:
    """A comma-separated list of positive integers (--lengths)."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    return values


def attn_item(text: str) -> str:
    """One ``--attn METHOD.KEY=VALUE`` of a multi-method tool (the method's constructor option KEY)."""
    target, sep, _ = text.partition("=")
    method, dot, key = target.partition(".")
    if not (sep and dot and method and key):
        raise argparse.ArgumentTypeError(f"takes METHOD.KEY=VALUE (e.g. performer.features=128), got {text!r}")
    return text


def out_file(out: str, name: str) -> Path:
    """``--out DIR``'s file ``name``: the folder is made, the path returned for the tool to write and report."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name
