"""The tasks: name → task class; ``get_task(name)`` gives a fresh task. Adding a task is its class and one entry
here.

- bench/tasks/base.py: what a task is (``Task``, the batch format); a task's presets are bench.config.Preset;
- bench/tasks/synthetic.py: ``duplicates`` and ``listops``, generated from the seed;
- bench/tasks/language.py: the byte-level language models ``enwik8``, ``bytes`` and ``wikitext2``;
- bench/tasks/lra.py: the LRA tasks ``text``, ``image``, ``pathfinder`` (bench/tasks/pathfinder.py draws its
  images) and ``retrieval``;
- bench/tasks/data_files.py: where data are looked for, downloads, archives and caches.
"""
from typing import Callable, Dict

from bench.tasks.base import IGNORE, Task, base_rate, model_inputs, task_loss
from bench.files import DataError, default_data_dir
from bench.tasks.language import Enwik8, LocalBytes, MaskedBytes
from bench.tasks.lra import Image, Pathfinder, Retrieval, Text
from bench.tasks.synthetic import Duplicates, ListOps

__all__ = ["TASKS", "get_task", "Task", "IGNORE", "DataError", "default_data_dir", "model_inputs", "task_loss",
           "base_rate"]

TASKS: Dict[str, Callable[[], Task]] = {
    "duplicates": Duplicates, "listops": ListOps, "enwik8": Enwik8, "bytes": LocalBytes, "wikitext2": MaskedBytes,
    "text": Text, "image": Image, "pathfinder": Pathfinder, "retrieval": Retrieval}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    return TASKS[name]()
