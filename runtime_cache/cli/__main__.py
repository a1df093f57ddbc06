"""``python -m runtime_cache.cli``: the ``runtime-cache`` command."""

import sys

from .app import main

if __name__ == "__main__":
    sys.exit(main())
