"""The registry's shape: each question one folder holding its pure rules, its reads and its
answer; loading the rules loads no SQLAlchemy (they are tested with literal rows); and each
label a projection stores is spelt alike in Python and in SQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from fleetbench.contract import wire
from fleetbench.registry.db import session_factory, write_transaction
from fleetbench.registry.ingest import ingest_batch
from fleetbench.registry.models import Run
from fleetbench.registry.settings_label import (
    server_shape_label,
    server_shape_label_sql,
    settings_label,
    settings_label_sql,
)
from tests.factories import make_report, make_serving_report
from tests.registry.test_projections import NODES, node_ids

PACKAGE = Path(__file__).parents[2] / "fleetbench"
QUESTIONS = ("placement", "capacity", "compare", "regressions", "curves")


PURE = [f"fleetbench.registry.{q}.rules" for q in QUESTIONS] + [
    "fleetbench.registry.curves.knee",
    "fleetbench.registry.regressions.knee_shifts",
]


@pytest.mark.parametrize("module", PURE)
def test_each_question_is_a_folder_whose_rules_import_no_sqlalchemy(module: str) -> None:
    """In a fresh interpreter, so that what else the suite imported does not count."""
    *_, question, _ = module.split(".")
    assert (PACKAGE / "registry" / question / "rules.py").exists()
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print(*sorted(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert module in loaded
    assert not {name for name in loaded if name.split(".")[0] in ("sqlalchemy", "fastapi")}


def test_the_registry_keeps_no_question_outside_its_folder() -> None:
    assert not (PACKAGE / "registry" / "questions").exists()
    flat = {path.stem for path in (PACKAGE / "registry").glob("*.py")}
    assert not flat & {*QUESTIONS, "latest", "labels", "rollouts", "knee", "knee_shifts"}


SETTINGS = [
    wire.RunSettings(),
    wire.RunSettings(n_ctx=4096, flash_attn="on", kv_unified=True, swa_full=False),
    wire.RunSettings(n_batch=2048, n_ubatch=512, pp_shared=False, tg_separate=True),
    wire.RunSettings(n_gpu_layers=-1, n_threads=8, cache_type_k="q8_0", cache_type_v="f16"),
]


def test_the_settings_label_is_spelt_alike_in_python_and_in_sql(engine: Engine) -> None:
    """On both databases: every setting's type (numbers, flags both ways, texts, none)."""
    sessions = session_factory(engine)
    ids = node_ids(sessions)
    reports = [make_report(node=NODES[0], settings=s) for s in SETTINGS]
    reports.append(
        make_serving_report(node=NODES[1], points=[(1, 30.0, 28.0, 90.0)], ctx_per_slot=None)
    )
    with sessions() as session, write_transaction(session):
        ingest_batch(session, [(r, ids[NODES.index(r.node)]) for r in reports])
        session.commit()
    with sessions() as session:
        by_id = {
            run_id: (settings, server)
            for run_id, settings, server in session.execute(
                select(Run.id, settings_label_sql(), server_shape_label_sql())
            )
        }
    for report in reports:
        in_sql, server_in_sql = by_id[report.run_id]
        assert in_sql == settings_label(report.settings)
        if report.server is not None:
            assert server_in_sql == server_shape_label(report.server.model_dump())
    assert by_id[reports[1].run_id][0] == (
        "n_ctx=4096 flash_attn=on kv_unified=True swa_full=False"
    )
    assert by_id[reports[-1].run_id][1] == (
        "kind=llama-server slots=4 prompt_tokens=512 gen_tokens=128"
    )
