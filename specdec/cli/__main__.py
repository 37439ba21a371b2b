"""``python -m specdec.cli …``: the same as the ``specdec`` command."""

import sys

from specdec.cli import main

if __name__ == "__main__":  # importing this module (tests import every module) must not run the CLI
    sys.exit(main())
