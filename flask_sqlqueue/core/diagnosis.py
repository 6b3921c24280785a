"""What ``flask queue doctor`` reports: one finding per check, with its fix.

Standard library only, so that each dialect module can report the checks of its own
database (``DialectOps.diagnose``) and ``doctor.py`` the rest, in the same terms.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A finding's level: nothing to do, worth a look, or unsafe (``doctor`` exits 1).
OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True, slots=True)
class Finding:
    """One checked thing: its ``level`` (:data:`OK`, :data:`WARN` or :data:`FAIL`), what
    was found, and what to do about it."""

    level: str
    message: str
    fix: str = ""
