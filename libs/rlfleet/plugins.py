"""Plugins through entry points: env tasks (`rlfleet.tasks`) and reward functions
(`rlfleet.rewards`).

A package adds a task or a reward function without editing rlfleet by declaring an entry
point in its own ``pyproject.toml``::

    [project.entry-points."rlfleet.tasks"]
    countdown = "my_package.tasks:countdown_task"

    [project.entry-points."rlfleet.rewards"]
    path-efficiency = "my_package.reward:reward"

The entry point's name is the name the object is served under, and must equal the name
the object reports. Names are unique: rlfleet's own built-ins and every installed plugin
share one namespace per group, and a name given twice (by two packages, or by a package
and a built-in) is refused with an error naming both sources; nothing is ever silently
overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")

TASKS_GROUP = "rlfleet.tasks"
REWARDS_GROUP = "rlfleet.rewards"


class PluginError(ValueError):
    """A plugin that cannot be used: a duplicate name, a load failure, a wrong type."""


@dataclass(frozen=True)
class Source:
    """Where a named object comes from: rlfleet itself or an installed entry point."""

    description: str
    entry_point: EntryPoint | None = None
    factory: Callable[[], Any] | None = None

    @classmethod
    def of(cls, ep: EntryPoint) -> Source:
        dist = getattr(ep, "dist", None)
        dist_name = f"{dist.name} {dist.version}" if dist is not None else "unknown package"
        return cls(f"entry point {ep.name!r} = {ep.value!r} in group {ep.group!r} "
                   f"({dist_name})", entry_point=ep)


class Registry(Generic[T]):
    """Named objects of one kind: built-ins plus the entry points of one group.

    What an entry point (or a built-in) names is either an object of the kind (used as it
    is) or a callable that makes one when called without arguments (a class, a factory
    function). Entry points are listed eagerly, so duplicate names are found at start-up,
    and loaded lazily: only what is used is imported."""

    def __init__(self, kind: str, group: str, *, is_kind: Callable[[Any], bool],
                 name_of: Callable[[Any], str]) -> None:
        self.kind = kind
        self.group = group
        self._is_kind = is_kind
        self._name_of = name_of
        self._sources: dict[str, Source] = {}
        self._loaded: dict[str, T] = {}

    def add(self, name: str, obj: Any, description: str = "rlfleet (built in)") -> None:
        """A built-in, or an object added in code. Refuses a name that is taken."""
        self._claim(name, Source(description, factory=lambda: obj))

    def discover(self, eps: Iterable[EntryPoint] | None = None) -> Registry[T]:
        """Adds every entry point of the group (or `eps`); refuses duplicates."""
        found = entry_points(group=self.group) if eps is None else eps
        for ep in sorted(found, key=lambda e: e.name):
            self._claim(ep.name, Source.of(ep))
        return self

    def _claim(self, name: str, source: Source) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._sources:
            raise PluginError(
                f"{self.kind} {name!r} is defined twice: by {self._sources[name].description} "
                f"and by {source.description}; rename one of them (nothing is overwritten)"
            )
        self._sources[name] = source

    def names(self) -> list[str]:
        return sorted(self._sources)

    def subset(self, names: Iterable[str]) -> Registry[T]:
        """A registry of `names` only (each must be here)."""
        other: Registry[T] = Registry(self.kind, self.group, is_kind=self._is_kind,
                                      name_of=self._name_of)
        for name in names:
            if name not in self._sources:
                raise PluginError(f"unknown {self.kind} {name!r}; known: {self.names()}")
            other._sources[name] = self._sources[name]
            if name in self._loaded:
                other._loaded[name] = self._loaded[name]
        return other

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def source(self, name: str) -> str:
        return self._sources[name].description

    def get(self, name: str) -> T:
        """The object called `name`, loaded on first use; an unknown name, a plugin that
        fails to import, or one of the wrong kind raises PluginError saying so."""
        if name in self._loaded:
            return self._loaded[name]
        source = self._sources.get(name)
        if source is None:
            raise PluginError(f"unknown {self.kind} {name!r}; known: {self.names()}")
        try:
            obj = source.entry_point.load() if source.entry_point else source.factory()
            if not self._is_kind(obj) and callable(obj):
                obj = obj()
        except Exception as exc:  # noqa: BLE001 - any failure of third-party code
            raise PluginError(f"{self.kind} {name!r} from {source.description} failed to "
                              f"load: {type(exc).__name__}: {exc}") from exc
        if not self._is_kind(obj):
            raise PluginError(f"{self.kind} {name!r} from {source.description} is a "
                              f"{type(obj).__name__}, not a {self.kind}")
        reported = self._name_of(obj)
        if reported != name:
            raise PluginError(f"{self.kind} {name!r} from {source.description} calls itself "
                              f"{reported!r}; the entry point's name and the {self.kind}'s "
                              "name must be the same")
        self._loaded[name] = obj
        return obj

    def load_all(self) -> dict[str, T]:
        return {name: self.get(name) for name in self.names()}
