"""Each hardware class's price per hour (registry.prices): listed to any reader, set and
removed by an admin."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from fleetbench.contract.bounds import WITHOUT_NUL
from fleetbench.registry.db import write_transaction
from fleetbench.registry.deps import AdminAuth, ReadAccess, SessionDep
from fleetbench.registry.hardware import DESCRIPTION_LENGTH
from fleetbench.registry.hardware import hardware_class as class_named
from fleetbench.registry.prices.answers import (
    HardwarePricePublic,
    HardwarePriceRequest,
    HardwarePricesPublic,
)
from fleetbench.registry.prices.store import list_prices, remove_price, set_price
from fleetbench.registry.responses import BAD_BODY, NOT_FOUND, TOO_LARGE

router = APIRouter(prefix="/prices", tags=["prices"])

HardwareClass = Annotated[
    str, Query(min_length=1, max_length=DESCRIPTION_LENGTH, pattern=WITHOUT_NUL)
]


@router.get("", response_model=HardwarePricesPublic, dependencies=[ReadAccess])
def read_prices(session: SessionDep) -> HardwarePricesPublic:
    """Every hardware class's price per hour, by class."""
    rows = [HardwarePricePublic.model_validate(row) for row in list_prices(session)]
    return HardwarePricesPublic(data=rows, count=len(rows))


@router.put("", response_model=HardwarePricePublic, responses={**BAD_BODY, **TOO_LARGE})
def put_price(
    body: HardwarePriceRequest, session: SessionDep, admin: AdminAuth
) -> HardwarePricePublic:
    """Sets a hardware class's price per hour, replacing the one it had: placement prices
    the tokens of its nodes by it from now on."""
    with write_transaction(session):
        row = set_price(
            session,
            hardware_class=body.hardware_class,
            usd_per_hour=body.usd_per_hour,
            set_by=admin.name,
        )
        answer = HardwarePricePublic.model_validate(row)
        session.commit()
    return answer


@router.delete("", status_code=204, responses=NOT_FOUND)
def delete_price(hardware_class: HardwareClass, session: SessionDep, _: AdminAuth) -> Response:
    """Removes a hardware class's price: its nodes' tokens are priced no more."""
    with write_transaction(session):
        if not remove_price(session, class_named(hardware_class) or hardware_class):
            raise HTTPException(
                status.HTTP_404_NOT_FOUND, detail=f"no price is set for {hardware_class!r}"
            )
        session.commit()
    return Response(status_code=204)
