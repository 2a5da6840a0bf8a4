"""Recipes: what a method with its own options and procedures adds to bench.train, kept in bench so that the
method file stays a leaf (torch, numpy and fastrg only; its ``main()`` only hands it to bench.train).

A recipe module (bench/methods.py names it in the method's entry) defines ``RECIPE = Recipe(...)``:
- ``config``: the method's settings dataclass, defined in the method file. Each field is one command-line option
  (``--field-name``; its metadata may give ``flag``, ``help``, ``metavar``, ``type``, ``nargs``, ``choices``,
  and ``negate``: a flag that sets the field to False). The default shown is the field's: written once.
- ``plan(cfg, args, config, task) -> Plan``: the attention factory and the hooks, given the method's settings,
  the parsed arguments, the resolved run config and the run's task (whose data are loaded by the time a hook
  runs). A ValueError here is a bad setting: one line, exit 2, before anything runs.
- ``profiles``: flags naming another constructor of the settings (SBM's ``--official``); a field whose default
  the profile changes takes its value from the profile unless given.
- ``preset_changes(cfg, task) -> {preset field: value}``: where the method changes a preset's value when the
  command line does not give one (SSA's ALiBi decoder drops positional embeddings).

A method with settings but no procedures needs no recipe module: its registry entry names the settings dataclass
(``options="module:Class"``) and ``settings_recipe`` makes the recipe, passing each field to the attention's
constructor by name.
"""
import argparse
import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

NOT_GIVEN = None  # the argparse default of an option a profile may set: given or not is told apart


@dataclass
class Hooks:
    """What a method can add to the loop.

    on_step(model, step, total_steps): called before every training step (SSA's dense fine-tuning tail).
    after_training(model, evaluate) -> dict: extra results merged into metrics.json; ``evaluate(split, limit,
    forward=None)`` returns {"metric", "loss", "density", ...} on the final weights.
    later_settings: {name: first_step(config) -> int}: the method's settings that act only from a step on (SSA's
    fine-tuning fraction: from its dense tail's first step; settings used only after training: from
    config["steps"]). --resume lets one differ from the checkpoint's when neither run's first step is before
    the checkpoint's step.
    """
    on_step: Optional[Callable] = None
    after_training: Optional[Callable] = None
    later_settings: Dict[str, Callable[[dict], int]] = field(default_factory=dict)


@dataclass
class Plan:
    """make_attention(model_cfg) -> (layer_index -> nn.Module), and the hooks."""
    make_attention: Callable
    hooks: Hooks = field(default_factory=Hooks)


@dataclass(frozen=True)
class Recipe:
    description: str
    config: type
    plan: Callable
    title: str = "method options"
    profiles: Dict[str, tuple] = field(default_factory=dict)  # flag name → (constructor, help)
    preset_changes: Optional[Callable] = None

    # ------------------------------------------------------------------------------------ options
    def options(self):
        """(field, flag, dest, kwargs of add_argument) per field of the settings dataclass."""
        hints = typing.get_type_hints(self.config)
        profiled = self.profiled_fields()
        for f in dataclasses.fields(self.config):
            meta, default = f.metadata, f.default
            flag = meta.get("flag", "--" + f.name.replace("_", "-"))
            dest = flag.lstrip("-").replace("-", "_")
            declared = hints[f.name]
            kwargs = {"dest": dest}
            if declared is bool and meta.get("negate"):
                kwargs.update(action="store_true", help=meta.get("help", ""))
            elif declared is bool and default is True:
                kwargs.update(action=argparse.BooleanOptionalAction, default=True,
                              help=f"{meta.get('help', '')} (default: true)")
            elif declared is bool:
                kwargs.update(action="store_true", help=meta.get("help", "") + self.shown(f, profiled))
            else:
                kwargs.update(type=meta.get("type", plain_type(declared)),
                              default=NOT_GIVEN if f.name in profiled else default,
                              help=meta.get("help", "") + self.shown(f, profiled))
                kwargs.update({k: meta[k] for k in ("metavar", "nargs", "choices") if k in meta})
            yield f, flag, dest, kwargs

    def profiled_fields(self) -> Dict[str, Dict[str, object]]:
        """field → {profile flag: its value there} for each field a profile changes."""
        plain = dataclasses.asdict(self.config())
        changed = {}
        for name, (make, _) in self.profiles.items():
            for key, value in dataclasses.asdict(make()).items():
                if value != plain[key]:
                    changed.setdefault(key, {})[name] = value
        return changed

    @staticmethod
    def shown(f, profiled) -> str:
        if f.default is None:
            return ""
        words = [f"{shown_value(value)} with --{name}" for name, value in profiled.get(f.name, {}).items()]
        joiner = " " if "nargs" in f.metadata else ","
        return f" (default: {'; '.join([shown_value(f.default, joiner), *words])})"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(self.title)
        for _, flag, _, kwargs in self.options():
            group.add_argument(flag, **kwargs)
        for name, (_, help) in self.profiles.items():
            group.add_argument(f"--{name}", action="store_true", help=help)

    def settings(self, args):
        """The method's settings from the parsed arguments (ValueError from the dataclass for a bad value)."""
        profiled = self.profiled_fields()
        values = {}
        for f, _, dest, _ in self.options():
            value = getattr(args, dest)
            if f.metadata.get("negate"):
                value = not value
            if f.name in profiled and (value is NOT_GIVEN or value is False):
                continue  # the profile's value (or the default) stands
            values[f.name] = value
        make = next((make for name, (make, _) in self.profiles.items() if getattr(args, name)), self.config)
        return make(**values)


def same_in_every_layer(attention: type, model_cfg, options: dict) -> Callable:
    """layer_index -> ``attention`` built from the interface's arguments and ``options`` (its budget or settings),
    the same in every layer; the model's ``max_len`` is added where the constructor takes one."""
    extra = ({"max_len": model_cfg.max_len}
             if "max_len" in inspect.signature(attention).parameters and "max_len" not in options else {})
    return lambda layer: attention(model_cfg.dim, model_cfg.heads, model_cfg.head_dim, model_cfg.attn_dropout,
                                   **options, **extra)


def settings_recipe(name: str, config: type, attention: type) -> Recipe:
    """The recipe of a method whose settings (the dataclass ``config``) are constructor arguments of its
    ``attention`` class and nothing more: every layer gets the same settings (and the model's ``max_len`` where
    the constructor takes one). A field the constructor does not take is refused when the recipe is made; a bad
    value by the dataclass's ``__post_init__`` (a ValueError: one line, exit 2, before anything runs)."""
    parameters = inspect.signature(attention).parameters
    unknown = [f.name for f in dataclasses.fields(config) if f.name not in parameters]
    if unknown:
        raise TypeError(f"{name}'s settings {config.__name__} has fields its attention {attention.__name__} does "
                        f"not take: {unknown}")

    def plan(cfg, args, run_config: dict, task) -> Plan:
        settings = dataclasses.asdict(cfg)
        return Plan(lambda model_cfg: same_in_every_layer(attention, model_cfg, settings))

    return Recipe(description=f"Train and evaluate {name} on one task.", config=config, plan=plan,
                  title=f"{name} options")


def plain_type(declared):
    """int for int and Optional[int], and so on: what argparse converts the text with."""
    args = [a for a in typing.get_args(declared) if a is not type(None)]
    return args[0] if typing.get_origin(declared) is typing.Union and len(args) == 1 else declared


def shown_value(value, joiner: str = ",") -> str:
    if isinstance(value, (tuple, list)):
        return joiner.join(str(v) for v in value) if value else "none"
    return str(value).lower() if isinstance(value, bool) else str(value)
