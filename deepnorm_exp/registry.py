"""Name -> class registries, filled by a decorator in each plug-in module.

A package (schemes, data sources) imports all of its submodules on first use, so adding a plug-in is
adding a file: no list to edit elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, TypeVar

from .errors import choice_error

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, key: str, package: str):
        self.key = key  # the config key users select with, for error messages ("norm", "data")
        self.package = package
        self._items: dict[str, T] = {}
        self._discovered = False

    def register(self, name: str) -> Callable[[T], T]:
        def decorate(item: T) -> T:
            if name in self._items and self._items[name] is not item:
                raise RuntimeError(f"{self.key} {name!r} registered twice")
            self._items[name] = item
            return item

        return decorate

    def _discover(self) -> None:
        if not self._discovered:
            pkg = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(pkg.__path__):
                importlib.import_module(f"{self.package}.{info.name}")
            self._discovered = True

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def get(self, name: str) -> T:
        self._discover()
        if name not in self._items:
            raise choice_error(self.key, name, self.names())
        return self._items[name]
