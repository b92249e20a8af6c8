"""``python -m lptrain.bench`` (and ``torchrun ... -m lptrain.bench``): the ``lptrain-bench`` command."""

import sys

from lptrain.bench.cli import main

sys.exit(main())
