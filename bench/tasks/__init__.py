"""The tasks: name → task class, named by module path ("module:Class") so that a run imports only its own
task's module; ``get_task(name)`` gives a fresh task. Adding a task is its class and one entry here. base.py:
what a task is; synthetic.py: ``duplicates``, ``recall`` (three sizes), ``chain``, ``ngram``, ``listops``; language.py: ``enwik8``, ``bytes``, ``wikitext2``;
lra.py: the LRA base, ``text``, ``retrieval``; image.py: ``image``; pathfinder.py: ``pathfinder``;
data_files.py: where data are looked for, downloads, archives and caches.
"""

import importlib
from typing import Dict

from bench.files import DataError, default_data_dir
from bench.tasks.base import IGNORE, Task, base_rate, model_inputs, task_loss

__all__ = [
    "TASKS",
    "get_task",
    "Task",
    "IGNORE",
    "DataError",
    "default_data_dir",
    "model_inputs",
    "task_loss",
    "base_rate",
]

TASKS: Dict[str, str] = {
    "duplicates": "bench.tasks.synthetic:Duplicates",
    "listops": "bench.tasks.synthetic:ListOps",
    "recall": "bench.tasks.synthetic:Recall",
    "recall-few": "bench.tasks.synthetic:RecallFew",
    "recall-many": "bench.tasks.synthetic:RecallMany",
    "chain": "bench.tasks.synthetic:Chain",
    "ngram": "bench.tasks.synthetic:NGram",
    "enwik8": "bench.tasks.language:Enwik8",
    "bytes": "bench.tasks.language:LocalBytes",
    "wikitext2": "bench.tasks.language:MaskedBytes",
    "text": "bench.tasks.lra:Text",
    "image": "bench.tasks.image:Image",
    "pathfinder": "bench.tasks.pathfinder:Pathfinder",
    "retrieval": "bench.tasks.lra:Retrieval",
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    module, _, cls = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
