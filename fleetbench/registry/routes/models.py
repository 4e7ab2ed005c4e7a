from __future__ import annotations

from fastapi import APIRouter

from fleetbench.contract import wire
from fleetbench.registry import crud
from fleetbench.registry.deps import ReadAccess, SessionDep
from fleetbench.registry.schemas import ModelPublic, ModelsPublic

router = APIRouter(prefix="/models", tags=["models"], dependencies=[ReadAccess])


@router.get("", response_model=ModelsPublic)
def read_models(session: SessionDep) -> ModelsPublic:
    """Every model reported, with its architecture numbers and run count."""
    models = [
        ModelPublic.model_validate(
            {
                **{field: getattr(model, field) for field in wire.ModelInfo.model_fields},
                "runs": runs,
                "last_run_at": last_run_at,
            }
        )
        for model, runs, last_run_at in crud.list_models(session)
    ]
    return ModelsPublic(data=models, count=len(models))
