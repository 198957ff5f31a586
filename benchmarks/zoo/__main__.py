"""Entry point of ``python -m benchmarks.zoo`` (see benchmarks.zoo.runner)."""

import sys

from benchmarks.zoo.runner import main

sys.exit(main())
