"""The one registry of attention methods: every entry point (train, grid, run_all, report, scaling, the tests)
reads it, so adding a method is its file plus one entry here. Standard library only at the top: the grid's
``--help`` imports it.
"""

import importlib
import importlib.util
import inspect
import math
import typing
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional

from bench.cli import parse_bool, plain_type

CORE_ARGUMENTS = ("dim", "heads", "head_dim", "dropout")  # the interface's; any other constructor argument is a budget


@dataclass(frozen=True)
class Method:
    name: str
    attention: str  # the class implementing INTERFACE.md, as "module:Class"
    # the method file a user runs (python ssa.py), whose main() is the method's training procedure and to which
    # python -m bench.train --method NAME hands the command line; None: a baseline, its budget as --attn options
    script: Optional[str] = None
    # whether the method has a causal form: one without (Linformer's and Nyströmformer's projections mix every
    # position) is "n/a" on the causal language-modelling tasks, decided before any process starts
    causal: bool = True
    # the tasks the grid runs the method on, reserved to it (the kernel method's own dense teacher is a masked LM:
    # Karkhanis et al., §4; its file also trains a causal one on bytes), or None for every task no method reserves
    tasks: Optional[FrozenSet[str]] = None
    # a quick-grid cell's CPU time relative to full attention's on the same task (64-256 tokens, one thread: at
    # these lengths every method's fixed costs outweigh full attention's quadratic term); the grid estimates its
    # time from it and dispatches the longest cells first, so side-by-side jobs end together
    cost: float = 1.0
    scaling: bool = True  # measured in the attention scaling table (experiments.scaling)
    # the --attn options the comparison grid gives the method, where its defaults would not make it sparse at
    # the quick tasks' 64-256 tokens; stated in every record's config
    grid_budget: Optional[Dict[str, object]] = None

    def module(self):
        return importlib.import_module(self.attention.split(":")[0])

    def load(self) -> type:
        """The attention class."""
        return getattr(self.module(), self.attention.split(":")[1])

    def available(self) -> bool:
        return importlib.util.find_spec(self.attention.split(":")[0]) is not None


REGISTRY = [
    Method("full", "baselines.full:FullAttention"),
    Method("linear", "baselines.linear:LinearAttention"),
    Method("linformer", "baselines.linformer:LinformerAttention", causal=False, cost=2.2),
    Method("performer", "baselines.performer:PerformerAttention", cost=2.9),
    Method("nystromformer", "baselines.nystromformer:NystromAttention", causal=False, cost=5.2),
    Method("reformer", "baselines.reformer:ReformerAttention", cost=6.5),
    # the fixed-sparse patterns at a quarter of the pairs (Longformer's 512 of 4096 keys): a pattern, not full attention
    Method("window", "baselines.window:WindowAttention", cost=1.2, grid_budget={"density": 0.25}),
    Method(
        "bigbird",
        "baselines.bigbird:BigBirdAttention",
        cost=1.2,
        grid_budget={"density": 0.25, "block": 8, "global_blocks": 1},
    ),
    # the block router: own block + 1 routed block of 8 keys, a quarter of the pairs at 64 tokens as the patterns above
    Method("moba", "baselines.moba:MoBAAttention", cost=1.5, grid_budget={"block": 8, "topk": 1}),
    # window heads beside one adaptive head: two registered attentions composed, swept in the matched-cost claim
    # (experiments/claims/matched_cost.py) rather than run by the grid
    Method("hybrid", "baselines.hybrid:HybridAttention", tasks=frozenset(), cost=6.5, scaling=False),
    Method("sbm", "sbm_transformer:SBMAttention", script="sbm_transformer.py", cost=3.0),
    Method("ssa", "ssa:SSAttention", script="ssa.py"),
    Method(
        "kernel",
        "kernel_sparse:KernelSparseAttention",
        script="kernel_sparse.py",
        tasks=frozenset({"wikitext2"}),
        scaling=False,
    ),
]
METHODS: Dict[str, Method] = {m.name: m for m in REGISTRY}


def available() -> Dict[str, Method]:
    """Registered methods whose module exists in this checkout, in registry order."""
    return {m.name: m for m in REGISTRY if m.available()}


def get(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
    return METHODS[name]


def applicable(method: str, task: str) -> bool:
    """Whether the grid runs ``method`` on ``task`` at all (a refusal for causality is decided apart): a method's
    own tasks, else every task that no method reserves for itself."""
    tasks = get(method).tasks
    return task in tasks if tasks is not None else all(task not in m.tasks for m in REGISTRY if m.tasks is not None)


def refusal(method: str, causal_task: bool) -> Optional[str]:
    """Why a method has no form for a task, or None: shown as the cell's "n/a (...)"."""
    if causal_task and not get(method).causal:
        return "no causal form"
    return None


# ------------------------------------------------------------------------------------------------ budgets
def same_in_every_layer(attention: type, model_cfg, options: dict) -> Callable:
    """layer_index -> ``attention`` built from the interface's arguments and ``options`` (its budget), the same
    in every layer; the model's ``max_len`` is added where the constructor takes one, and the layer's index where
    it takes ``layer`` (a layer allocation)."""
    parameters = inspect.signature(attention).parameters
    extra = {"max_len": model_cfg.max_len} if "max_len" in parameters and "max_len" not in options else {}
    return lambda layer: attention(
        model_cfg.dim,
        model_cfg.heads,
        model_cfg.head_dim,
        model_cfg.attn_dropout,
        **options,
        **extra,
        **({"layer": layer} if "layer" in parameters else {}),
    )


def option_names(method: str) -> List[str]:
    """What --attn KEY=VALUE may give ``method``: its constructor's arguments beyond the interface's."""
    return [name for name in inspect.signature(get(method).load()).parameters if name not in (*CORE_ARGUMENTS, "layer")]


def attention_options(method: str, texts: Dict[str, str]) -> dict:
    """--attn KEY=VALUE texts as the values the attention's constructor declares: KEY must be one of its budget
    arguments, VALUE is parsed to that argument's annotation (else its default's type). ValueError naming the
    option, the value and the type expected, or the options there are."""
    cls = get(method).load()
    params = {name: inspect.signature(cls).parameters[name] for name in option_names(method)}
    try:
        hints = typing.get_type_hints(cls.__init__)
    except (NameError, TypeError):
        hints = {}
    options = {}
    for key, text in texts.items():
        if key not in params:
            raise ValueError(f"{method} takes no option {key!r}; its options: {list(params)}")
        default = params[key].default
        declared = hints.get(key, type(default) if default not in (inspect.Parameter.empty, None) else str)
        try:
            options[key] = parse_as(text, declared)
        except ValueError:
            raise ValueError(f"--attn {key}={text}: {method}'s {key} takes {type_words(declared)}") from None
    return options


def parse_as(text: str, declared):
    """``text`` as a value of the type ``declared`` (bool, int, float, str, Optional of one); ValueError if not."""
    if plain_type(declared) is not declared:  # Optional[X]
        return None if text.lower() == "none" else parse_as(text, plain_type(declared))
    if declared is bool:
        return parse_bool(text)
    if declared is int:
        return int(text)
    if declared is float and math.isfinite(float(text)):
        return float(text)
    if declared is str:
        return text
    raise ValueError(text)


def type_words(declared) -> str:
    if plain_type(declared) is not declared:
        return f"{type_words(plain_type(declared))} or none"
    words = {bool: "true or false", int: "an integer", float: "a finite number", str: "text"}
    return words.get(declared, f"{declared} values, which --attn cannot give")
