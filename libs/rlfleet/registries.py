"""Named extension points: one `Registry` type for every kind of thing chosen by name.

rlfleet chooses by name: GRPO advantage estimators, policy losses and KL estimators
(`rlfleet.grpo`), env tasks (`rlfleet.tasks`), reward functions (`rlfleet.reward`),
inference engines (`rlfleet.engines`), policy profiles (`rlfleet.policy.profiles`: what
serving a model asks of vLLM) and maze action formats (`rlfleet.maze.actions`). Each kind
has one `Registry` of rlfleet's own entries plus, where a package may add some, the entry
points of one group. A package adds an entry without editing rlfleet by declaring it in
its own ``pyproject.toml``::

    [project.entry-points."rlfleet.tasks"]
    countdown = "my_package.tasks:countdown_task"

    [project.entry-points."rlfleet.rewards"]
    path-efficiency = "my_package.reward:reward"

    [project.entry-points."rlfleet.advantage_estimators"]
    rloo = "my_package.grpo:rloo"

    [project.entry-points."rlfleet.serving_profiles"]
    my-vlm-7b = "my_package.profiles:MY_VLM_7B"   # a rlfleet.policy.ServingProfile

The entry point's name is the name the object is used under, and, for kinds whose objects
carry a name (tasks, rewards, engines), must equal the name the object reports. Names are
unique: rlfleet's own entries, every installed plugin and everything registered in code
share one namespace per kind, and a name given twice is refused with an error naming both
sources; nothing is ever silently overwritten. An unknown name is an error that lists the
known ones.

Entry points are the way to reach every process: a learner's Ray workers are separate
processes, so a GRPO variant registered in code in the driver only is unknown there (the
worker says so at start-up); one declared as an entry point is found by every process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Entry-point groups, one per kind a package may add to.
TASKS_GROUP = "rlfleet.tasks"
REWARDS_GROUP = "rlfleet.rewards"
ADVANTAGE_ESTIMATORS_GROUP = "rlfleet.advantage_estimators"
POLICY_LOSSES_GROUP = "rlfleet.policy_losses"
KL_ESTIMATORS_GROUP = "rlfleet.kl_estimators"
SERVING_PROFILES_GROUP = "rlfleet.serving_profiles"
FORMAT_PROFILES_GROUP = "rlfleet.format_profiles"

BUILT_IN = "rlfleet (built in)"


class RegistryError(ValueError):
    """A name that cannot be used: a duplicate, an unknown name, a plugin that fails to
    load or is of the wrong kind."""


@dataclass(frozen=True)
class Source:
    """Where a named object comes from: rlfleet itself, code, or an installed entry point."""

    description: str
    entry_point: EntryPoint | None = None
    factory: Callable[[], Any] | None = None

    @classmethod
    def of(cls, ep: EntryPoint) -> Source:
        dist = getattr(ep, "dist", None)
        dist_name = f"{dist.name} {dist.version}" if dist is not None else "unknown package"
        return cls(f"entry point {ep.name!r} = {ep.value!r} in group {ep.group!r} "
                   f"({dist_name})", entry_point=ep)


def _any(_obj: object) -> bool:
    return True


class Registry(Generic[T]):
    """Named objects of one kind: entries added in code (`add`, `register`) plus, with a
    `group`, the entry points of that group (`discover`).

    What an entry names is either an object of the kind (used as it is) or a callable that
    makes one when called without arguments (a class, a factory function); `is_kind`
    tells them apart (default: everything is of the kind, e.g. plain functions). With
    `name_of`, a loaded object must report the name it is registered under. Entry points
    are listed eagerly, so duplicates are found at start-up, and loaded lazily: only what
    is used is imported. With `autodiscover`, the group's entry points are listed on the
    first look-up (registries that live at module level, like the GRPO ones)."""

    def __init__(self, kind: str, group: str | None = None, *,
                 is_kind: Callable[[Any], bool] = _any,
                 name_of: Callable[[Any], str] | None = None,
                 autodiscover: bool = False) -> None:
        if autodiscover and group is None:
            raise ValueError("autodiscover needs an entry-point group")
        self.kind = kind
        self.group = group
        self._is_kind = is_kind
        self._name_of = name_of
        self._sources: dict[str, Source] = {}
        self._loaded: dict[str, T] = {}
        self._discovered = not autodiscover

    # -- adding ---------------------------------------------------------------------------

    def add(self, name: str, obj: Any, description: str = BUILT_IN) -> None:
        """An entry added in code (a built-in, a test's). Refuses a name that is taken."""
        self._claim(name, Source(description, factory=lambda: obj))

    def register(self, name: str, description: str = BUILT_IN) -> Callable[[Any], Any]:
        """Decorator form of `add`: ``@REGISTRY.register("name")`` over a function."""
        self._check_name(name)

        def decorator(obj: Any) -> Any:
            self.add(name, obj, description)
            return obj

        return decorator

    def discover(self, eps: Iterable[EntryPoint] | None = None) -> Registry[T]:
        """Adds every entry point of the group (or `eps`); refuses duplicates."""
        if eps is None:
            if self.group is None:
                raise ValueError(f"the {self.kind} registry has no entry-point group")
            eps = entry_points(group=self.group)
        self._discovered = True
        for ep in sorted(eps, key=lambda e: e.name):
            self._claim(ep.name, Source.of(ep))
        return self

    def unregister(self, name: str) -> None:
        """Removes an entry (tests, plugins that are unloaded)."""
        if name not in self._sources:
            raise RegistryError(f"{self.kind} {name!r} is not registered")
        del self._sources[name]
        self._loaded.pop(name, None)

    def _check_name(self, name: object) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} names must be non-empty strings, got {name!r}")

    def _claim(self, name: str, source: Source) -> None:
        self._check_name(name)
        if name in self._sources:
            raise RegistryError(
                f"{self.kind} {name!r} is defined twice: by {self._sources[name].description} "
                f"and by {source.description}; rename one of them (nothing is overwritten)"
            )
        self._sources[name] = source

    def _ensure_discovered(self) -> None:
        if not self._discovered:
            self.discover()

    # -- looking up -------------------------------------------------------------------------

    def names(self) -> list[str]:
        self._ensure_discovered()
        return sorted(self._sources)

    def __contains__(self, name: object) -> bool:
        self._ensure_discovered()
        return name in self._sources

    def source(self, name: str) -> str:
        return self._source(name).description

    def _source(self, name: str) -> Source:
        self._ensure_discovered()
        source = self._sources.get(name)
        if source is None:
            raise RegistryError(self.unknown_message(name))
        return source

    def unknown_message(self, name: object, where: str = "") -> str:
        """The error text for a name that is not here (listing the ones that are)."""
        at = f" in {where}" if where else ""
        return f"unknown {self.kind} {name!r}{at}; registered: {self.names()}"

    def check(self, name: str, where: str = "") -> None:
        """RegistryError unless `name` is registered: the start-up check of a configured
        name (`where` says which process, for an error in a Ray worker)."""
        if name not in self:
            raise RegistryError(self.unknown_message(name, where))

    def subset(self, names: Iterable[str]) -> Registry[T]:
        """A registry of `names` only (each must be here)."""
        other: Registry[T] = Registry(self.kind, self.group, is_kind=self._is_kind,
                                      name_of=self._name_of)
        for name in names:
            other._sources[name] = self._source(name)
            if name in self._loaded:
                other._loaded[name] = self._loaded[name]
        return other

    def get(self, name: str) -> T:
        """The object called `name`, loaded on first use; an unknown name, a plugin that
        fails to import, or one of the wrong kind raises RegistryError saying so."""
        if name in self._loaded:
            return self._loaded[name]
        source = self._source(name)
        try:
            obj = source.entry_point.load() if source.entry_point else source.factory()
            if not self._is_kind(obj) and callable(obj):
                obj = obj()
        except Exception as exc:  # noqa: BLE001 - any failure of third-party code
            raise RegistryError(f"{self.kind} {name!r} from {source.description} failed to "
                                f"load: {type(exc).__name__}: {exc}") from exc
        if not self._is_kind(obj):
            raise RegistryError(f"{self.kind} {name!r} from {source.description} is a "
                                f"{type(obj).__name__}, not a {self.kind}")
        if self._name_of is not None:
            reported = self._name_of(obj)
            if reported != name:
                raise RegistryError(
                    f"{self.kind} {name!r} from {source.description} calls itself "
                    f"{reported!r}; the entry point's name and the {self.kind}'s name must "
                    "be the same")
        self._loaded[name] = obj
        return obj

    def load_all(self) -> dict[str, T]:
        return {name: self.get(name) for name in self.names()}
