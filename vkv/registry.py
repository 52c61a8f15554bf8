"""Name → implementation tables that a decorator fills: `rule = registrar(POOLING_RULES)`, then `@rule("uniform")`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def registrar(table: dict[str, T]) -> Callable[[str], Callable[[T], T]]:
    """A decorator factory that files the decorated object in `table` under the given name."""

    def named(name: str) -> Callable[[T], T]:
        def register(obj: T) -> T:
            table[name] = obj
            return obj

        return register

    return named
