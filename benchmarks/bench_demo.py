"""Record the demo's time to first inference, cold and warm, with the machine and the driver.

Runs ``python -m runtime_cache.demo --json`` once on a fresh, private cache folder (the
demo itself runs the cold and the warm process), and writes its result together with
the machine (``_common.machine_info``) and the OpenCL platform and device it ran on to
``benchmarks/results/demo-<label>.json``; ``plot.py`` draws figure 1 from it.

Usage::

    python benchmarks/bench_demo.py                      # first device; label from the driver
    python benchmarks/bench_demo.py --device 1 --label intel
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import RESULTS, machine_info, write_json


def driver_info(spec: str | None) -> dict[str, Any]:
    """The platform and device the demo picks for ``spec`` (the demo's own choice)."""
    from runtime_cache.demo.device import select_device

    device = select_device(spec)
    platform = device.platform
    return {
        "platform_name": str(platform.name).strip(),
        "platform_version": str(platform.version).strip(),
        "device": str(device.name).strip(),
        "driver_version": str(device.driver_version).strip(),
    }


def label_for(driver: dict[str, Any]) -> str:
    """A short file label: ``pocl``, ``nvidia``, ``intel``, or the platform's first word."""
    name = driver["platform_name"].lower()
    for known, label in (("portable computing", "pocl"), ("nvidia", "nvidia"), ("intel", "intel")):
        if known in name:
            return label
    return name.split()[0] if name else "device"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="an OpenCL device: index or name part")
    parser.add_argument("--model", default="cnn", choices=("cnn", "tiny"))
    parser.add_argument("--label", default=None, help="file label (default: from the driver)")
    parser.add_argument("--out", default=None, help="the JSON file to write")
    args = parser.parse_args(argv)
    driver = driver_info(args.device)
    command = [sys.executable, "-m", "runtime_cache.demo", "--json", "--model", args.model]
    if args.device is not None:
        command += ["--device", args.device]
    with tempfile.TemporaryDirectory(prefix="rc-bench-demo-") as folder:
        done = subprocess.run(
            [*command, "--cache", f"dir://{folder}"],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
            cwd=folder,  # not the source tree: the child imports the installed package
        )
    demo = json.loads(done.stdout)
    demo["cache"] = "dir://<a fresh temporary folder>"  # the path itself says nothing
    result = {"benchmark": "demo", **machine_info(), "driver": driver, "demo": demo}
    out = Path(args.out) if args.out else RESULTS / f"demo-{args.label or label_for(driver)}.json"
    write_json(out, result)
    cold, warm = demo["cold"], demo["warm"]
    print(f"{driver['device']} ({driver['platform_version']})")
    for phase in cold["phases"]:
        print(
            f"  {phase:<8} cold {cold['phases'][phase]:8.2f} s"
            f"   warm {warm['phases'][phase]:8.2f} s"
        )
    print(
        f"  first inference: cold {cold['time_to_first_inference_s']:.2f} s, "
        f"warm {warm['time_to_first_inference_s']:.2f} s ({demo['speedup']}x)"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
