"""`rlfleet.registries.Registry`, the one registry type: names are unique across code and
entry points, unknown names list the known ones, and every kind rlfleet chooses by name
(GRPO variants, tasks, rewards, engines) is one of them."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from rlfleet.engines import ENGINES
from rlfleet.engines.hf import HFEngine
from rlfleet.grpo.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.grpo.losses import KL_ESTIMATORS, POLICY_LOSSES
from rlfleet.registries import Registry, RegistryError
from rlfleet.reward import default_rewards
from rlfleet.tasks import default_tasks


def test_a_name_is_registered_once_and_never_overwritten() -> None:
    registry: Registry[object] = Registry("widget")

    @registry.register("a")
    def first() -> int:
        return 1

    def second() -> int:
        return 2

    with pytest.raises(RegistryError, match=r"widget 'a' is defined twice: by rlfleet "
                                            r"\(built in\) and by tests"):
        registry.add("a", second, "tests")
    assert registry.get("a") is first  # the first stays
    with pytest.raises(RegistryError, match="non-empty strings"):
        registry.register("")


def test_an_unknown_name_lists_the_known_ones() -> None:
    registry: Registry[object] = Registry("widget")
    registry.add("b", object())
    registry.add("a", object())
    with pytest.raises(RegistryError, match=r"unknown widget 'c'; registered: \['a', 'b'\]"):
        registry.get("c")
    with pytest.raises(RegistryError, match=r"unknown widget 'c' in worker 3; registered"):
        registry.check("c", "worker 3")
    registry.check("a")
    registry.unregister("a")
    assert registry.names() == ["b"] and "a" not in registry
    with pytest.raises(RegistryError, match="'a' is not registered"):
        registry.unregister("a")


def test_entry_points_load_through_it_and_clash_with_code() -> None:
    registry: Registry[object] = Registry("estimator", "tests.group")
    registry.add("grpo", object())
    with pytest.raises(RegistryError, match="'grpo' is defined twice: by rlfleet "
                                            r"\(built in\) and by entry point 'grpo'"):
        registry.discover([EntryPoint("grpo", "math:sqrt", "tests.group")])
    registry.discover([EntryPoint("sqrt", "math:sqrt", "tests.group")])
    import math

    assert registry.get("sqrt") is math.sqrt  # imported on first use
    assert "entry point 'sqrt'" in registry.source("sqrt")
    registry.discover([EntryPoint("gone", "no_such_module_anywhere:f", "tests.group")])
    with pytest.raises(RegistryError, match="'gone' .* failed to load: ModuleNotFoundError"):
        registry.get("gone")


def test_every_kind_rlfleet_chooses_by_name_is_a_registry() -> None:
    for registry in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS, ENGINES,
                     default_tasks(discover=False)._registry,
                     default_rewards(discover=False)._registry):
        assert isinstance(registry, Registry)
    # rlfleet's own (installed plugins may add more)
    assert {"dr_grpo", "grpo"} <= set(ADVANTAGE_ESTIMATORS.names())
    assert "ppo_clip" in POLICY_LOSSES
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())
    assert ADVANTAGE_ESTIMATORS.group == "rlfleet.advantage_estimators"


def test_engines_by_name() -> None:
    assert ENGINES.names() == ["hf", "vllm"]
    assert ENGINES.get("hf") is HFEngine
    with pytest.raises(RegistryError, match=r"unknown engine 'tgi'; registered: \['hf', "
                                            r"'vllm'\]"):
        ENGINES.get("tgi")
