"""Reading a definition bundle from disk: ``.tools.abl``, ``.yaml`` and
``.yml`` files, from the paths given or the directories below them."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ._errors import ConfigError

_SUFFIXES = (".tools.abl", ".yaml", ".yml")


def bundle_files(paths: Iterable[str | os.PathLike[str]]) -> dict[str, str]:
    """``{path: content}`` of every definition file under ``paths``, sorted.

    Raises :class:`ConfigError` for a path that does not exist or a file that
    cannot be read as UTF-8, naming it.
    """
    files: dict[str, str] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise ConfigError(f"definitions path {root} does not exist")
        found = sorted(root.rglob("*")) if root.is_dir() else [root]
        for path in found:
            if path.is_file() and path.name.endswith(_SUFFIXES):
                try:
                    files[str(path)] = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as e:
                    raise ConfigError(f"reading definition file {path}: {e}") from None
    return files
