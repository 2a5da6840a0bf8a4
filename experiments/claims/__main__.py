"""`python -m experiments.claims`: the runner of experiments/claims/__init__.py."""

import os
import sys

from experiments.claims import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:  # `... | head` closed the pipe: the rest was not wanted; no traceback (Python's signal docs)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 1
sys.exit(code)
