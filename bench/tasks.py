"""The registry of tasks: name → task class; ``get_task(name)`` gives a fresh task. What a task is (``Task``,
``Preset``, the batch format) and the tasks outside LRA (duplicates, listops, enwik8, bytes, wikitext2) are in
bench/datasets.py, the LRA tasks (text, image, pathfinder, retrieval) in bench/lra.py, their data I/O in
bench/data.py. Adding a task is its class and one entry here.
"""
from typing import Callable, Dict

from bench.data import DataError, default_data_dir
from bench.datasets import IGNORE, Duplicates, Enwik8, ListOps, LocalBytes, MaskedBytes, Preset, Task
from bench.lra import Image, Pathfinder, Retrieval, Text

__all__ = ["TASKS", "get_task", "Task", "Preset", "IGNORE", "DataError", "default_data_dir"]

TASKS: Dict[str, Callable[[], Task]] = {
    "duplicates": Duplicates, "listops": ListOps, "enwik8": Enwik8, "bytes": LocalBytes, "wikitext2": MaskedBytes,
    "text": Text, "image": Image, "pathfinder": Pathfinder, "retrieval": Retrieval}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    return TASKS[name]()
