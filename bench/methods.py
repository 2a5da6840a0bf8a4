"""The one registry of attention methods: every entry point (train, grid, run_all, report, scaling, the tests)
reads it, so adding a method is its file plus one entry here (or, outside this repository, a module named in
$SPARSE_ATTN_PLUGINS that calls ``register``: every process of a run, cells included, imports it).

    Method("name", "module:Class", script="file.py" or None, recipe="bench.recipes.x" or None,
           options="module:Settings" or None, causal=..., tasks=..., cost=..., scaling=...)

- ``attention``: the class implementing INTERFACE.md, as ``module:Class``.
- ``script``: the method file a user runs (``python ssa.py``; the grid runs it so too); its ``main()`` hands it to
  ``bench.train``, as ``python -m bench.train --method NAME`` does.
- ``recipe``: the module of bench/recipes/ holding the method's own options (its settings dataclass) and
  procedures (SBM's regulariser, SSA's fine-tuning tail, the kernel pipeline). ``None``: the class is trained by
  ``bench.train`` with ``--attn key=value`` options, or with ``options``' flags.
- ``options``: for a method with settings of its own but no procedures, its settings dataclass as
  ``module:Class`` (usually in the method file): each field becomes a flag (bench/recipes/__init__.py says how) and
  is passed to the attention's constructor by name. No recipe module is needed then: the file and this entry are
  the whole of adding such a method.
- ``causal``: whether the method has a causal form. A method without one (Linformer's and Nyströmformer's
  projections mix every position) is "n/a" on the causal language-modelling tasks, decided before any process
  starts.
- ``tasks``: the only tasks the method runs on (the kernel method is a masked-LM pipeline, paper 003 §4), or
  ``None`` for every task that no method reserves.
- ``cost``: a quick-grid cell's CPU time relative to full attention's on the same task (64-256 tokens, one
  thread; the mean over the quick tasks of one measured run: at these lengths every method's fixed costs
  outweigh full attention's quadratic term, which only long sequences change). The grid estimates its time from
  it and dispatches the longest cells first, so side-by-side jobs end together.
- ``scaling``: measured in the attention scaling table (``bench.scaling``).
"""
import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional


@dataclass(frozen=True)
class Method:
    name: str
    attention: str
    script: Optional[str] = None
    recipe: Optional[str] = None
    options: Optional[str] = None
    causal: bool = True
    tasks: Optional[FrozenSet[str]] = None
    cost: float = 1.0
    scaling: bool = True

    def load(self):
        """(module, attention class)."""
        module_name, class_name = self.attention.split(":")
        module = importlib.import_module(module_name)
        return module, getattr(module, class_name)

    def load_recipe(self):
        """The method's bench.recipes.Recipe (its recipe module's, or one made from ``options``), or None."""
        if self.recipe:
            return importlib.import_module(self.recipe).RECIPE
        if self.options:
            from bench.recipes import settings_recipe
            module_name, class_name = self.options.split(":")
            return settings_recipe(self.name, getattr(importlib.import_module(module_name), class_name),
                                   self.load()[1])
        return None

    def available(self) -> bool:
        return importlib.util.find_spec(self.attention.split(":")[0]) is not None


REGISTRY = [
    Method("full", "baselines.full:FullAttention"),
    Method("linear", "baselines.linear:LinearAttention"),
    Method("linformer", "baselines.linformer:LinformerAttention", causal=False, cost=2.0),
    Method("performer", "baselines.performer:PerformerAttention", cost=2.7),
    Method("nystromformer", "baselines.nystromformer:NystromAttention", causal=False, cost=5.0),
    Method("reformer", "baselines.reformer:ReformerAttention", cost=7.5),
    Method("sbm", "sbm_transformer:SBMAttention", script="sbm_transformer.py", recipe="bench.recipes.sbm",
           cost=9.0),
    Method("ssa", "ssa:SSAttention", script="ssa.py", recipe="bench.recipes.ssa"),
    Method("kernel", "kernel_sparse:KernelSparseAttention", script="kernel_sparse.py",
           recipe="bench.recipes.kernel", tasks=frozenset({"wikitext2"}), scaling=False),
]
METHODS: Dict[str, Method] = {m.name: m for m in REGISTRY}


def register(method: Method) -> None:
    """Adds a method (a plug-in, or a test's toy attention) to the registry every entry point reads."""
    if method.name in METHODS:
        raise ValueError(f"a method named {method.name!r} is registered already")
    REGISTRY.append(method)
    METHODS[method.name] = method


def available() -> Dict[str, Method]:
    """Registered methods whose module exists in this checkout, in registry order."""
    return {m.name: m for m in REGISTRY if m.available()}


def get(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
    return METHODS[name]


def reserved_tasks() -> FrozenSet[str]:
    """Tasks that some method reserves for itself (no other method runs there)."""
    return frozenset().union(*(m.tasks for m in REGISTRY if m.tasks is not None))


def applicable(method: str, task: str) -> bool:
    """Whether the grid runs ``method`` on ``task`` at all (a refusal for causality is decided apart)."""
    tasks = get(method).tasks
    return task in tasks if tasks is not None else task not in reserved_tasks()


def refusal(method: str, causal_task: bool) -> Optional[str]:
    """Why a method has no form for a task, or None: shown as the cell's "n/a (...)"."""
    if causal_task and not get(method).causal:
        return "no causal form"
    return None


for _plugin in filter(None, os.environ.get("SPARSE_ATTN_PLUGINS", "").split(",")):
    importlib.import_module(_plugin)  # each plugin module calls register(Method(...)) when imported
