"""The keys of a module's programs, each planned once: :class:`ModulePlans`."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..key_template import KeyTemplate
from .includes import Options
from .plan import ProgramPlan
from .pocl_flags import pocl_flags_unknown
from .program import key_templates, options_text, plan_program

__all__ = ["ModulePlans"]


class ModulePlans:
    """Plans (keys, options, devices) of one module's programs, made on first use.

    The driver's option string and the per-device key templates are worked out with
    the first plan and shared by the rest, so a program's plan costs its own parts
    only (its source digest, includes and name). Safe to use from several threads.
    """

    def __init__(
        self, context: Any, sources: Mapping[str, str], options: Options, module_id: str
    ) -> None:
        self._context = context
        self._sources = sources
        self._options = options
        self._module_id = module_id
        self._lock = threading.Lock()
        self._plans: dict[str, ProgramPlan] = {}
        self._text = ""
        self._templates: list[KeyTemplate] | None = None
        self._devices: list[Any] = []  # the context's, asked of the driver once
        self._replanned = False

    def plan(self, name: str) -> ProgramPlan:
        """The plan of program ``name``; ``KeyError`` if the module has none of that name."""
        with self._lock:
            if self._templates is None:  # (first: the PoCL look below needs the devices)
                self._text = options_text(self._context, self._options)
                self._devices = list(self._context.devices)
                self._templates = key_templates(self._devices, self._module_id, self._text)
            if self._plans and not self._replanned and pocl_flags_unknown(self._devices):
                self._plans.clear()  # (planned with keys before: now built uncached)
                self._replanned = True
            plan = self._plans.get(name)
            if plan is not None:
                return plan
            if name not in self._sources:
                raise KeyError(f"no kernel {name!r} in module {self._module_id}")
            plan = plan_program(
                self._context,
                self._sources[name],
                self._options,
                devices=self._devices,
                module_id=self._module_id,
                program=name,
                options_text=self._text,
                templates=self._templates,
            )
            self._plans[name] = plan
            return plan
