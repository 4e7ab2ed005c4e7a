"""fleetbench's version, as its package's metadata says it: what both command lines'
`--version`, the registry's /healthz and its API schema say."""

from __future__ import annotations

import importlib.metadata

__all__ = ["VERSION"]


def _installed() -> str:
    try:
        return importlib.metadata.version("fleetbench")
    except importlib.metadata.PackageNotFoundError:  # a source tree run without installing
        return "0+unknown"


VERSION = _installed()
