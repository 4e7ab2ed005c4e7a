"""A model's facts (file size, architecture: what its KV cache and fit follow from) as the
nodes reported them. Nodes that disagree each keep theirs (table model_facts; a run names
the set it came with), so no node's report changes what another node's answers use: a
node's fit is checked against its own facts, or, when it reported none, against those most
nodes' latest runs came with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetbench.contract import wire
from fleetbench.contract.answers import FactsSource
from fleetbench.registry.models import LatestRun, Model, ModelFacts

__all__ = ["FitFacts", "FleetFacts", "model_info"]


@dataclass(frozen=True)
class FitFacts:
    """The model's facts a node's figures are computed from, and whose they are."""

    info: wire.ModelInfo
    source: FactsSource


class FleetFacts:
    """The facts of some models: each set their nodes reported, and per model the set most
    nodes' latest runs came with (ties: the first stored). One query."""

    def __init__(self, session: Session, models: Sequence[Model]) -> None:
        self._session = session
        self._models = {model.id: model for model in models}
        self._sets: dict[int, wire.ModelInfo] = {}
        self._most: dict[int, int] = {}
        self._none: dict[int, FitFacts] = {}  # the models no node reported facts of
        self.set_counts: dict[int, int] = {}  # by model: how many distinct sets reported
        nodes = func.count(LatestRun.node_id)
        rows = session.execute(
            select(ModelFacts, nodes)
            .outerjoin(LatestRun, LatestRun.facts_id == ModelFacts.id)
            .where(ModelFacts.model_id.in_(self._models))
            .group_by(ModelFacts.id)
            .order_by(nodes.desc(), ModelFacts.id)
        ).all()
        for facts, count in rows:
            self._sets[facts.id] = model_info(self._models[facts.model_id], facts)
            self.set_counts[facts.model_id] = self.set_counts.get(facts.model_id, 0) + 1
            if count:
                self._most.setdefault(facts.model_id, facts.id)

    def of(self, model_id: int, facts_id: int | None) -> FitFacts:
        """The facts for a node whose latest run of the model came with `facts_id`."""
        if facts_id is None:
            return self.most_reported(model_id)
        if facts_id not in self._sets:  # stored since this object read them
            found = self._session.get(ModelFacts, facts_id)
            self._sets[facts_id] = model_info(self._models[model_id], found)
        return FitFacts(self._sets[facts_id], "node")

    def most_reported(self, model_id: int) -> FitFacts:
        most = self._most.get(model_id)
        if most is not None:
            return FitFacts(self._sets[most], "most nodes")
        if model_id not in self._none:  # asked once per node: made once per model
            self._none[model_id] = FitFacts(model_info(self._models[model_id], None), "none")
        return self._none[model_id]


def model_info(model: Model, facts: ModelFacts | None) -> wire.ModelInfo:
    """The model's facts as the wire states them, taken as stored and not validated again:
    a row stored under older, looser rules must not fail every answer about it."""
    values: dict[str, Any] = {"name": model.name, "sha256": model.sha256}
    if facts is not None:
        values |= {
            name: getattr(facts, name)
            for name in wire.ModelInfo.model_fields
            if hasattr(facts, name)
        }
        values["layers"] = _layers(facts.layers)
    return wire.ModelInfo.model_construct(**values)


def _layers(stored: dict[str, Any] | None) -> wire.KvLayers | None:
    """The per-layer facts as stored; None where they no longer validate (a row stored
    under older rules says nothing per layer rather than failing every answer)."""
    if stored is None:
        return None
    try:
        return wire.KvLayers.model_validate(stored)
    except ValidationError:
        return None
