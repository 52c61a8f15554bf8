"""Make a set of kept lines syntactically whole before rendering.

Keeping any line of a unit keeps the unit's skeleton and that of every enclosing unit (a statement
keeps its `if` header, the function signature, the closing braces). Whitespace-only lines are kept
when the lines around them are. In Python, a kept block whose statements are all gone must get a
statement-shaped placeholder (`...`); the line where it goes is returned for the renderer.
"""

from __future__ import annotations

import numpy as np

from vkv.backends.longcodezip.units import FREE, Document


def close_kept_lines(doc: Document, kept: np.ndarray) -> tuple[np.ndarray, set[int]]:
    """The smallest superset of `kept` that renders as valid syntax, and the statement-placeholder lines."""
    owners = np.asarray(doc.owner)
    kept_units = _with_ancestors(doc, {int(u) for u in np.unique(owners[kept & (owners != FREE)])})
    closed = np.isin(owners, list(kept_units)) & (owners != FREE)
    closed |= _free_lines_between_kept(owners, closed)
    return closed, _empty_bodies(doc, kept_units)


def _with_ancestors(doc: Document, units: set[int]) -> set[int]:
    closed = set()
    for unit in units:
        while unit >= 0 and unit not in closed:
            closed.add(unit)
            unit = doc.units[unit].parent
    return closed


def _free_lines_between_kept(owners: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """A whitespace-only line is kept iff the nearest non-blank lines on both sides are (or absent)."""
    count = len(owners)
    result = np.zeros(count, dtype=bool)
    previous_kept = True
    for i in range(count):
        if owners[i] != FREE:
            previous_kept = bool(kept[i])
        else:
            result[i] = previous_kept
    next_kept = True
    for i in range(count - 1, -1, -1):
        if owners[i] != FREE:
            next_kept = bool(kept[i])
        else:
            result[i] &= next_kept
    return result


def _empty_bodies(doc: Document, kept_units: set[int]) -> set[int]:
    """First statement line of each kept unit's body that lost all its statements (Python only)."""
    lines = set()
    for unit in kept_units:
        for body in doc.units[unit].bodies:
            if not body.needs_statement:
                continue
            statements = [c for c in body.children if doc.units[c].kind != "comment"]
            if statements and not any(c in kept_units for c in statements):
                lines.add(min(doc.units[c].start for c in statements))
    return lines
