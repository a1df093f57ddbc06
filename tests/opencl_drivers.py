"""List the OpenCL drivers that can build here, one per line: ``PYOPENCL_CTX value<TAB>name``.

``.ci/run`` runs the OpenCL suite once per line (``PYOPENCL_CTX`` selects the
driver). Drivers are told apart by version, not by platform name: Debian's PoCL
and pip's both call themselves "Portable Computing Language". With
``RUNTIME_CACHE_REQUIRE_OPENCL=1``, fewer than two working drivers is an error.

Usage: ``python3 tests/opencl_drivers.py``
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    """Print the working drivers; the exit code (1: fewer than required)."""
    import pyopencl as cl

    from runtime_cache.opencl.devices import driver_label, try_devices

    labels = [driver_label(p) for p in cl.get_platforms()]
    working: dict[str, str] = {}
    for index, label in enumerate(labels):
        trials = try_devices(str(index), first=True)
        if trials and trials[-1].works:
            working[str(index)] = label
        else:
            errors = "; ".join(f"{t.error}" for t in trials) or "no device"
            print(f"driver {label}: cannot build here ({errors})", file=sys.stderr)
    for value, label in working.items():
        print(f"{value}\t{label}")
    if os.environ.get("RUNTIME_CACHE_REQUIRE_OPENCL") == "1" and len(working) < 2:
        print(
            f"at least two working OpenCL drivers are required, found {len(working)}: "
            + (", ".join(working.values()) or "none"),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    raise SystemExit(main())
