"""The registry's shape: each question one folder holding its pure rules, its reads and its
answer; the rules import no SQLAlchemy, however deep (they are tested with literal rows);
and each label a projection stores is spelt alike in Python and in SQL."""

from __future__ import annotations

import ast
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


def _imports(module: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _file_of(module: str) -> Path | None:
    path = PACKAGE.parent / module.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _reaches(start: Path) -> set[str]:
    """Every module `start` imports, and theirs, following fleetbench's own."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for name in _imports(todo.pop()):
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("fleetbench.") and (found := _file_of(name)) is not None:
                todo.append(found)
    return seen


@pytest.mark.parametrize("question", QUESTIONS)
def test_each_question_is_a_folder_whose_rules_import_no_sqlalchemy(question: str) -> None:
    folder = PACKAGE / "registry" / question
    assert (folder / "rules.py").exists()
    reached = _reaches(folder / "rules.py")
    assert not {name for name in reached if name.split(".")[0] == "sqlalchemy"}
    assert "fastapi" not in {name.split(".")[0] for name in reached}


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
