"""JSON arguments (a run's input, a signal's payload, an answer) encoded
before any call is made, strictly and the same way as the TypeScript
client (``clients/typescript/src/json.ts``): only ``None``, booleans,
integers, finite floats, strings, lists and tuples, and dicts with string
keys are JSON; anything else is refused with :class:`InvalidJson` naming
where it is (``$.items[2].when``) and what it is. A ``str`` is a JSON
string, never parsed: pass the decoded document, not JSON text."""

from __future__ import annotations

import json
import math
from typing import Any

from ._errors import InvalidJson

_SIMPLE_KEY = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _key_path(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` for a key that is not a plain name."""
    if key and not key[0].isdigit() and set(key) <= _SIMPLE_KEY:
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def _not_json(value: Any) -> str | None:
    """What ``value`` itself is when it cannot be JSON (its children aside), else ``None``."""
    if value is None or isinstance(value, (bool, int, str, list, tuple, dict)):
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return "a number that is not finite (NaN)"
        if math.isinf(value):
            return f"a number that is not finite ({'' if value > 0 else '-'}Infinity)"
        return None
    if callable(value):
        return "a function"
    return f"an object of type {type(value).__name__}"


def _check(value: Any, path: str, open_: set[int]) -> None:
    """Raise :class:`_Refused` at the first value under ``value`` that is not JSON
    (``open_``: the ids of the containers being walked, to find cycles)."""
    what = _not_json(value)
    if what is not None:
        raise _Refused(path, what)
    if isinstance(value, (list, tuple, dict)):
        if id(value) in open_:
            raise _Refused(path, "a circular reference")
        open_.add(id(value))
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _Refused(path, f"an object with a key that is not a string ({key!r})")
                _check(item, _key_path(path, key), open_)
        else:
            for i, item in enumerate(value):
                _check(item, f"{path}[{i}]", open_)
        open_.discard(id(value))


class _Refused(Exception):
    """Where and what the first non-JSON value is (turned into InvalidJson by :func:`dumps`)."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(path, what)
        self.path = path
        self.what = what


def dumps(value: Any, what: str) -> str:
    """``value`` as compact JSON text, or :class:`InvalidJson` naming
    ``what`` (``the run's input``), where the offending value is and what it is."""
    try:
        _check(value, "$", set())
    except _Refused as refused:
        raise InvalidJson(f"{what} is not JSON: {refused.path} is {refused.what}") from None
    return json.dumps(value, separators=(",", ":"), allow_nan=False)
