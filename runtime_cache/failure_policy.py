"""The failure policy: a failing store is logged once per outage, counted, and skipped.

Both the front (:class:`runtime_cache.Cache`, per read and write side) and
:class:`runtime_cache.backends.tiered.TieredBackend` (per tier) use it, so an
outage reads the same in the logs wherever it is absorbed: one warning when it
starts, debug lines while it lasts, and one line when it ends. A side that fails again
within :data:`FLAP_SECONDS` of the warning for its last outage starts a quiet one, its
start and end at debug level: one immutable entry among good ones made each write flip
the store between "read-only" and "works again", two warnings a call.

>>> import logging
>>> policy = FailurePolicy(logging.getLogger("doc"), "the store", "carrying on")
>>> policy.failed("get", OSError("down"))
>>> policy.errors, policy.failing("read")
(1, True)
>>> policy.succeeded()
>>> policy.failing("read")
False
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from .errors import EntryTooLargeError, InvalidKeyError, ReadOnlyBackendError
from .fork_locks import renew_in_child

__all__ = ["FLAP_SECONDS", "WRITES", "FailurePolicy"]

#: Operations that count on the write side; every other one is a read.
WRITES = frozenset(
    {"set", "set_many", "delete", "delete_if", "promote", "promote-over", "background write"}
)

T = TypeVar("T")

#: Seconds after an outage's warning within which a side's next outage is logged quietly.
FLAP_SECONDS = 60.0


class FailurePolicy:
    """Counts failures of one store and logs them once per outage and side.

    Args:
        logger: where the lines go.
        subject: how the store is named in them (e.g. ``repr(backend)``).
        consequence: what happens meanwhile (e.g. "carrying on without the cache").
        strict: re-raise every failure after counting it, instead of absorbing it.
        recovered_level: the log level of the "works again" line.
    """

    def __init__(
        self,
        logger: logging.Logger,
        subject: str,
        consequence: str,
        *,
        strict: bool = False,
        recovered_level: int = logging.WARNING,
    ) -> None:
        self.log = logger
        self.subject = subject
        self.consequence = consequence
        self.strict = strict
        self.recovered_level = recovered_level
        self.errors = 0
        #: The latest failure, as ``"op: Type: message"`` (``None`` before any).
        self.last_error: str | None = None
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")
        self._failing: set[str] = set()
        self._warned: dict[str, float] = {}  # side -> when its last outage was warned of
        self._quiet: set[str] = set()  # sides in an outage logged at debug level
        self._told_refused: set[type[BaseException]] = set()  # (each kind logged once)
        #: The sides (``"read"``, ``"write"``) whose last call failed: a hot path calls
        #: :meth:`succeeded` only when this is not empty.
        self.failing_sides = self._failing

    def note(self, op: str, exc: BaseException) -> None:
        """Keep ``exc`` as :attr:`last_error` (the front calls it for every error it counts)."""
        self.last_error = f"{op}: {type(exc).__name__}: {exc}"

    def refused(self, exc: BaseException) -> None:
        """A call the store refused for what it was given, not for the store's state (a
        value over its size cap, a key it cannot hold): counted, logged once a kind (then
        at debug level), never an outage to recover from; re-raised when strict."""
        with self._lock:
            self.errors += 1
            first = type(exc) not in self._told_refused
            self._told_refused.add(type(exc))
        if self.strict:
            raise exc
        self.log.log(logging.WARNING if first else logging.DEBUG, "runtime-cache: %s", exc)

    @staticmethod
    def side(op: str) -> str:
        """``"write"`` for operations that change the store, else ``"read"``."""
        return "write" if op in WRITES else "read"

    def failing(self, side: str) -> bool:
        """Whether the last call on ``side`` failed."""
        return side in self._failing

    def failed(self, op: str, exc: BaseException, side: str | None = None) -> None:
        """Count a failure of ``op``; log it if it starts an outage; re-raise when strict.
        A value the store refused for its size (:class:`EntryTooLargeError`), or a key it
        cannot hold (:class:`InvalidKeyError`), is no outage: see :meth:`refused`."""
        if isinstance(exc, (EntryTooLargeError, InvalidKeyError)):
            self.refused(exc)
            return
        side = side or self.side(op)
        with self._lock:
            self.errors += 1
            first = side not in self._failing
            self._failing.add(side)
            if first:
                now = time.monotonic()
                if now - self._warned.get(side, -FLAP_SECONDS) < FLAP_SECONDS:
                    self._quiet.add(side)
                    first = False  # (said at debug level below)
                else:
                    self._warned[side] = now
        if self.strict:
            # The caller gets the error itself; "carrying on" would be untrue.
            self.log.debug("runtime-cache: %s failed on %s: %s", op, self.subject, exc)
            raise exc
        if first and side == "write" and isinstance(exc, ReadOnlyBackendError):
            # Not an outage to sit out: a store this process may only read.
            self.log.warning(
                "runtime-cache: %s is read-only here (%s); serving reads, skipping writes",
                self.subject,
                exc,
            )
        elif first:
            self.log.warning(
                "runtime-cache: %s failed on %s (%s: %s); %s until it recovers",
                op,
                self.subject,
                type(exc).__name__,
                exc,
                self.consequence,
            )
        else:
            self.log.debug("runtime-cache: %s failed again on %s: %s", op, self.subject, exc)

    def succeeded(self, side: str = "read") -> None:
        """Note that a call on ``side`` worked; log the end of an outage once."""
        # Reads and writes recover apart: a read-only store keeps failing writes
        # while reads succeed, and must not log once per call.
        if side in self._failing:
            with self._lock:
                was = side in self._failing
                self._failing.discard(side)
                quiet = side in self._quiet
                self._quiet.discard(side)
            if was:
                level = logging.DEBUG if quiet else self.recovered_level
                self.log.log(level, "runtime-cache: %ss on %s work again", side, self.subject)

    def attempt(
        self, op: str, call: Callable[[], T], errors: list[Exception]
    ) -> tuple[bool, T | None]:
        """Run ``call()``: ``(True, result)``, or ``(False, None)`` after counting its failure
        in ``errors``. A bad key is the caller's error, not an outage: it is raised."""
        try:
            result = call()
        except InvalidKeyError:
            raise
        except Exception as exc:
            self.failed(op, exc)
            errors.append(exc)
            return False, None
        self.succeeded(self.side(op))
        return True, result
