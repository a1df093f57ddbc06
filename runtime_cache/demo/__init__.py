"""The first-inference demo: a small OpenCL model, a real tuner, and ``runtime-cache demo``.

Run it with ``runtime-cache demo`` or ``python -m runtime_cache.demo``.
"""
