"""The process's state (registry.state): bounded caches, one object per app."""

from __future__ import annotations

from pathlib import Path

from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.main import create_app
from fleetbench.registry.state import Bounded, ProcessState


def test_a_bounded_cache_lets_the_least_recently_used_go_by_weight() -> None:
    held: Bounded[str, str] = Bounded(10, weigh=len)
    held.put("a", "xxxx")
    held.put("b", "xxxx")
    assert held.get("a") == "xxxx"  # a is now the most recently used
    held.put("c", "xxxx")  # 12 > 10: b goes
    assert (held.get("a"), held.get("b"), held.get("c")) == ("xxxx", None, "xxxx")
    held.put("a", "x")  # replaced: its old weight no longer counts
    held.put("d", "xxxx")
    assert len(held) == 3
    held.put("e", "x" * 11)  # heavier than the whole budget: not kept, nothing let go
    assert held.get("e") is None
    assert len(held) == 3


def test_each_app_has_its_own_state(tmp_path: Path) -> None:
    first, second = (
        create_app(RegistrySettings(database_url=f"sqlite:///{tmp_path / name}.db"))
        for name in ("one", "two")
    )
    states = [app.state.process for app in (first, second)]
    assert all(isinstance(state, ProcessState) for state in states)
    assert states[0].compare_answers is not states[1].compare_answers
    assert states[0].known_rows is not states[1].known_rows
