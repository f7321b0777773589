"""The exception streamfeed.export raises for a module the service cannot
train as it is, in a module of its own so that the converter (export.py)
and the modules beside it that map ops raise the same class without
importing export.py, which imports them. ``streamfeed.export.ExportError``
is this class."""
from __future__ import annotations

__all__ = ["ExportError"]


class ExportError(ValueError):
    """A module the service cannot train as it is. ``op`` is the module class
    or function, ``module_path`` where it sits in the module (``""``: the
    top-level module), ``supported`` what would map instead."""

    def __init__(self, message: str, op: str = "", module_path: str = "", supported: str = ""):
        self.op, self.module_path, self.supported = op, module_path, supported
        where = f" at {module_path!r}" if module_path else " in the top-level module" if op else ""
        text = f"cannot export {op}{where}: {message}" if op else message
        if supported:
            text += f". Supported: {supported}"
        super().__init__(text)
