"""``python -m runtime_cache.demo``: the demo without the ``runtime-cache`` command."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
