"""``python -m mindspeed_ops``: the ``mindspeed-ops`` command line (see :mod:`mindspeed_ops.cli`)."""
import sys

from .cli import main

sys.exit(main())
