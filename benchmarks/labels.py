"""Names for what a results file measured on: the driver, the device, the machine.

Results written before ``_common.machine_info`` existed carry less (``host`` with two
fields, or a ``machine`` string); every function here reads both shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

Run = Mapping[str, Any]


def device_name(device: Mapping[str, Any] | str) -> str:
    """A device's name without PoCL's ``pthread-`` and CPU-target prefixes."""
    name = str(device.get("name", "") if isinstance(device, Mapping) else device).strip()
    name = re.sub(r"^pthread-", "", name)
    name = re.sub(r"^[a-z0-9]+(-[a-z0-9]+)*-(?=[A-Z])", "", name)  # e.g. skylake-avx512-
    return re.sub(r"\((R|TM)\)", "", name)


def driver_name(platform_name: str, platform_version: str) -> str:
    """``PoCL 3.1``, ``NVIDIA CUDA 13.0.98``, or the platform's own name."""
    pocl = re.search(r"PoCL ([0-9][\w.+-]*)", platform_version)
    if pocl or "Portable Computing" in platform_name:
        return f"PoCL {pocl.group(1)}" if pocl else "PoCL"
    cuda = re.search(r"CUDA ([0-9.]+)", platform_version)
    if cuda:
        return f"NVIDIA CUDA {cuda.group(1)}"
    return platform_name.strip() or platform_version.strip() or "unknown driver"


def opencl_driver(run: Run) -> str:
    """The driver of an ``opencl-*.json`` run, with the driver-cache setting when it was on."""
    device = run.get("device", {})
    name = driver_name(
        str(device.get("platform_name", "")), str(device.get("platform_version", ""))
    )
    cache = " (driver cache on)" if run.get("driver_cache") == "on" else ""
    if run.get("driver_cache_restored_files"):
        cache = " (driver cache carried by runtime-cache)"
    return f"{name} on {device_name(device)}{cache}"


def demo_driver(run: Run) -> str:
    """The driver and device of a ``demo-*.json`` run."""
    driver = run.get("driver", {})
    name = driver_name(
        str(driver.get("platform_name", "")), str(driver.get("platform_version", ""))
    )
    return f"{name} on {device_name(str(driver.get('device', '')))}"


def machine(run: Run) -> str:
    """The machine a run came from: CPU model and cores (or what the file says), and the date."""
    host = run.get("host") if isinstance(run.get("host"), Mapping) else run.get("meta", run)
    assert isinstance(host, Mapping)
    cores = host.get("cpus")
    text = re.sub(r"\((R|TM)\)", "", str(host.get("cpu") or ""))
    if not text and "device" in run and cores and cores <= 4:
        text = device_name(run["device"])  # a CPU driver runs on the host's CPU
    described = str(host.get("machine", ""))
    if cores and not re.search(r"\bcores\b", described):
        described = f"{described}, {cores} cores".strip(", ")
    text = f"{text} ({described})" if text and described else text or described or "unknown"
    date = str(run.get("date") or host.get("date") or "")[:10]
    return f"{text}, {date}" if date else text
