"""Train and evaluate one method on one task: ``python -m bench.train --method NAME --task T [options]``.

    python -m bench.train --method full --task duplicates [--steps N --seed S --out DIR ...]
    python -m bench.train --method performer --task listops --attn features=128
    torchrun --nproc_per_node 2 -m bench.train --method full --task listops      # DDP (gloo on CPU, nccl on CUDA)

A baseline (bench/methods.py, no script) is trained here by the one loop (bench/loop.py), its constructor's
budget given as ``--attn key=value``. A method with a file of its own (SBM, SSA, the kernel method) is handed
to that file's ``main()``, which holds the method's procedure: ``python -m bench.train --method ssa`` and
``python ssa.py`` run the same code. Bad input is one line: exit 2 for settings, 1 for data.
"""

import argparse
import sys
from typing import List, Optional, Tuple

from bench import cli
from bench import methods as registry


def parse_attn_option(text: str):
    """KEY=VALUE → (KEY, VALUE text); registry.attention_options gives VALUE the type the attention declares."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--attn expects key=value, got {text!r}")
    return tuple(text.split("=", 1))


def method_asked(argv: List[str]) -> Tuple[str, List[str]]:
    """The --method asked for, and argv less it (what a method's own file parses)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--method", default="full")
    asked, rest = pre.parse_known_args(argv)
    return asked.method, rest


def build_parser(prog: str = "python -m bench.train") -> argparse.ArgumentParser:
    p = cli.run_parser(prog, "Train and evaluate one method on one task.")
    names = list(registry.available())
    p.add_argument(
        "--method",
        default="full",
        choices=names,
        metavar="NAME",
        help=f"attention method: {', '.join(names)} (a method with a file of its own runs its main())",
    )
    p.add_argument(
        "--attn",
        action="append",
        type=parse_attn_option,
        default=[],
        metavar="KEY=VALUE",
        help="a baseline's budget option, passed to its constructor (repeatable; each baseline's KEYs "
        "are listed below)",
    )
    p.epilog = lambda: (
        "--attn KEYs of each baseline (sbm, ssa and kernel take their own options instead):\n"
        + "\n".join(
            f"  {name}: {', '.join(registry.option_names(name))}"
            for name, method in registry.available().items()
            if not method.script
        )
        + "\n\n"
        + cli.preset_tables()
    )
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name, rest = method_asked(argv)
    if name in registry.available() and registry.get(name).script:
        prog = f"python -m bench.train --method {name}"
        return registry.get(name).module().main(rest, prog=prog)
    p = build_parser()
    args = p.parse_args(argv)
    with cli.one_line_errors():
        from bench import loop
        from bench.config import SetupError
        from bench.tasks import get_task

        try:
            attn = registry.attention_options(args.method, dict(args.attn))
        except ValueError as exc:
            raise SetupError(str(exc)) from None
        cfg = cli.run_config(args, args.method, attn=attn)
        attention = registry.get(args.method).load()
        run = loop.setup(
            cfg, get_task(cfg.task), lambda model_cfg: registry.same_in_every_layer(attention, model_cfg, cfg.attn)
        )
        loop.train(run)
        loop.finish(run, loop.final_record(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
