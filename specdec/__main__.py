"""``python -m specdec …``: the same as the ``specdec`` command (and ``python -m specdec.cli``)."""

import sys

from specdec.cli import main

if __name__ == "__main__":  # importing this module (tests import every module) must not run the CLI
    sys.exit(main())
