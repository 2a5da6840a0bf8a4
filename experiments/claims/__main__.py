"""`python -m experiments.claims`: the runner of experiments/claims/__init__.py."""

import sys

from experiments.claims import main

sys.exit(main())
