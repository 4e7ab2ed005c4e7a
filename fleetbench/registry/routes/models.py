from __future__ import annotations

from fastapi import APIRouter

from fleetbench.registry import crud
from fleetbench.registry.deps import ReadAccess, SessionDep
from fleetbench.registry.model_facts import FleetFacts
from fleetbench.registry.schemas import ModelPublic, ModelsPublic

router = APIRouter(prefix="/models", tags=["models"], dependencies=[ReadAccess])


@router.get("", response_model=ModelsPublic)
def read_models(session: SessionDep) -> ModelsPublic:
    """Every model reported, with its run count and the facts (architecture numbers, file
    size) most nodes' latest runs came with; `fact_sets` > 1: nodes disagree."""
    listed = crud.list_models(session)
    facts = FleetFacts(session, [model for model, _, _ in listed])
    models = [
        ModelPublic.model_validate(
            {
                **facts.most_reported(model.id).info.model_dump(),
                "fact_sets": facts.set_counts.get(model.id, 0),
                "runs": runs,
                "last_run_at": last_run_at,
            }
        )
        for model, runs, last_run_at in listed
    ]
    return ModelsPublic(data=models, count=len(models))
