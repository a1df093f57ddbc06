"""Storage backends, imported as ``runtime_cache.backends``.

Each backend lives in its own module and is found through the registry by URL
scheme (entry-point group ``runtime_cache.backends``); importing this package
imports none of them.
"""
