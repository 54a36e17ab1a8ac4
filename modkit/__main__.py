"""``python -m modkit``: the same as the ``modkit`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
