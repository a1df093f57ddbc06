"""Running from a source checkout: find ``runtime_cache.backends`` in ``backends/`` beside it.

The distribution maps the checkout's ``backends/`` folder to the package
``runtime_cache.backends`` (setuptools ``package-dir``). An installed copy has
it inside the package; a source checkout does not. Python started in the
checkout's root (``python -c``, ``python -m runtime_cache``, ``python -m
pytest``) imports the checkout's ``runtime_cache/`` ahead of any installed copy,
and without this module that package would have no backends. So, when the
package was imported from a checkout (a ``pyproject.toml`` and a ``backends/``
package beside it, none inside it), :func:`attach_backends` imports that
``backends/`` folder as ``runtime_cache.backends``. An installed package is
left as it is.
"""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["attach_backends"]

_NAME = "runtime_cache.backends"


def attach_backends(package_file: str) -> bool:
    """Import a source checkout's ``backends/`` as ``runtime_cache.backends``.

    ``package_file`` is ``runtime_cache/__init__.py``. Returns whether it did.
    """
    package_dir = os.path.dirname(os.path.abspath(package_file))
    if _NAME in sys.modules or os.path.isfile(os.path.join(package_dir, "backends", "__init__.py")):
        return False
    root = os.path.dirname(package_dir)
    folder = os.path.join(root, "backends")
    init = os.path.join(folder, "__init__.py")
    if not (os.path.isfile(init) and os.path.isfile(os.path.join(root, "pyproject.toml"))):
        return False
    spec = importlib.util.spec_from_file_location(_NAME, init, submodule_search_locations=[folder])
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
        raise
    setattr(sys.modules["runtime_cache"], "backends", module)  # noqa: B010 - typed ModuleType
    return True
