"""The rows one batch of reports writes, each step one statement for the whole batch: the
engine builds and models it names (remembered per process), its fingerprints, runs, points
and failed points, and each node's activity."""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from fleetbench.contract import wire
from fleetbench.contract.accelerator import on_accelerator
from fleetbench.contract.allocation import allocated_bytes, beside_kv_bytes, predicted_kv_bytes
from fleetbench.contract.bandwidth import PointLimit, node_bandwidth, point_limit
from fleetbench.contract.wire import model_name_key
from fleetbench.registry.bulk import insert_rows
from fleetbench.registry.hardware import hardware_class, summarize_hardware
from fleetbench.registry.ingest.answers import IngestLimits, ReportRefused
from fleetbench.registry.ingest.statements import MODEL_FACTS, Statements
from fleetbench.registry.models import FailedPoint, Run, RunPoint, ServingPointRow, table_of
from fleetbench.registry.projections.base import CurvePoint, StoredRun

MOST_KNOWN_ROWS = 100_000
_STORED_UNDER = ("id", "node_id", "model_id", "build_id", "facts_id", "received_at")


@dataclass
class KnownRows:
    """Ids of rows by identity, per database, filled only from committed transactions:
    engine builds, models and model facts never change once written."""

    builds: dict[str, int] = field(default_factory=dict)
    models: dict[str, int] = field(default_factory=dict)
    # by (model, the facts' values in MODEL_FACTS' order and the layers' JSON): no digest
    # for facts known already
    facts: dict[tuple[int, tuple[Any, ...]], int] = field(default_factory=dict)

    def learn(self, other: KnownRows) -> None:
        if len(self.builds) + len(self.models) + len(self.facts) > MOST_KNOWN_ROWS:
            self.builds, self.models, self.facts = {}, {}, {}  # bounded: learnt again
        self.builds.update(other.builds)
        self.models.update(other.models)
        self.facts.update(other.facts)


def sha256_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build_identity(fields: dict[str, Any]) -> str:
    """An engine build's identity, or a model's facts': a digest of all its fields (NULLs
    included)."""
    return sha256_of(json.dumps(fields, sort_keys=True))


@dataclass
class IncomingRun:
    """One report of a batch on its way in; `id` is the one it is stored under (the
    reported run id unless another node's run holds it: assign_ids)."""

    index: int  # in the batch
    report: wire.RunReport
    node_id: int
    digest: str
    received_at: datetime
    id: uuid.UUID = field(init=False)
    build_id: int = 0
    model_id: int = 0
    facts_id: int | None = None

    def __post_init__(self) -> None:
        self.id = self.report.run_id

    @functools.cached_property
    def on_accelerator(self) -> tuple[bool | None, str | None]:
        """Whether it measured its node's accelerator, and why not (contract.accelerator)."""
        report = self.report
        hardware = report.hardware.data if report.hardware else None
        return on_accelerator(hardware, report.engine.backend, report.settings.n_gpu_layers)

    @functools.cached_property
    def bandwidth(self) -> wire.MemoryBandwidth | None:
        """The peak bandwidth its points are held against (contract.bandwidth)."""
        hardware = self.report.hardware
        if hardware is None:
            return None
        data = wire.HardwareData.model_validate(hardware.data)  # validated once already
        return node_bandwidth(data, on_accelerator=self.on_accelerator[0])

    @functools.cached_property
    def limits(self) -> list[PointLimit]:
        """Each point's MBU, and why it cannot be true where it is above the limit."""
        report = self.report
        return [
            point_limit(
                b=p.b,
                pp=p.pp,
                tg=p.tg,
                s_tg=p.s_tg,
                model=report.model,
                settings=report.settings,
                bandwidth=self.bandwidth,
            )
            for p in report.points
        ]

    @property
    def contention_reason(self) -> str | None:
        contention = self.report.contention
        return contention.reason if contention is not None else None

    @property
    def in_series(self) -> bool:
        """Whether it joins its node's offline curves: the latest, the series, the bound."""
        report = self.report
        return report.kind == "offline" and report.status != "failed" and not self.contended

    @property
    def contended(self) -> bool:
        return self.contention_reason is not None

    def stored(self, fingerprints: Fingerprints) -> StoredRun:
        """The run, stored, as the projections read it."""
        report = self.report
        fingerprint = fingerprint_of(self, fingerprints)
        return StoredRun(
            # the ids it is stored under, and when it arrived
            **{name: getattr(self, name) for name in _STORED_UNDER},
            kind=report.kind,
            failed=report.status == "failed",
            contended=self.contended,
            started_at=report.started_at,
            settings=report.settings,
            points=[
                CurvePoint(
                    p.pp,
                    p.tg,
                    p.b,
                    p.s_pp,
                    p.s_tg,
                    limit.mbu,
                    limit.impossible is not None,
                    p.energy.joules if p.energy else None,
                )
                for p, limit in zip(report.points, self.limits, strict=True)
            ],
            server=report.server,
            engine_on_accelerator=self.on_accelerator[0],
            beside_kv_bytes=beside_kv_bytes(report.buffers),
            memory_bytes=fingerprint.memory_bytes if fingerprint else None,
        )

    @property
    def key(self) -> tuple[int, uuid.UUID]:
        """What identifies the run: its node and the id the node gave it."""
        return (self.node_id, self.report.run_id)


@dataclass(frozen=True)
class MadeBy:
    """The node whose report is stored, and how many rows of each kind its reports may make."""

    node_id: int
    limit: int


_KINDS = {
    "engine_builds": "engine builds",
    "models": "models",
    "model_facts": "sets of model facts",
}


def _get_or_insert(
    connection: Connection,
    sql: Statements,
    find: Any,
    insert_row: Any,
    keys: dict[str, Any],
    values: dict[str, Any],
    made_by: MadeBy,
) -> int:
    """The id of the row `find` finds by `keys`, inserted with `values` if there is none
    (a concurrent insert of the same row is found once committed); refused (ReportRefused)
    when the node's reports made as many rows of the table as it may make: one node cannot
    fill the registry with names. Writers storing at the same moment may each pass the
    bound by one row."""
    found = connection.execute(find, keys).first()
    if found is None:
        table = insert_row.table.name
        node = {"node_id": made_by.node_id}
        made = connection.execute(sql.made_by_node[table], node).scalar_one()
        if made >= made_by.limit:
            raise ReportRefused(
                f"this node's reports made {made} {_KINDS[table]} already, this registry's "
                f"limit (FLEETBENCH_MAX_ROWS_PER_NODE); an admin can raise it"
            )
        row = {**keys, **values, "created_by_node_id": made_by.node_id}
        connection.execute(insert_row, row)
        found = connection.execute(find, keys).one()
    return int(found.id)


def build_id_of(
    connection: Connection,
    sql: Statements,
    engine: wire.EngineBuild,
    known: KnownRows,
    learned: KnownRows,
    made_by: MadeBy,
) -> int:
    fields = engine.model_dump()
    identity = build_identity(fields)
    # What this batch learned first: it is newer than what the process remembers.
    build_id = learned.builds.get(identity) or known.builds.get(identity)
    if build_id is None:
        keys = {"identity": identity}
        build_id = _get_or_insert(
            connection, sql, sql.build_by_identity, sql.insert_build, keys, fields, made_by
        )
        learned.builds[identity] = build_id
    return build_id


def model_identity(info: wire.ModelInfo) -> str:
    """What a model is stored under (models.Model): its digest with its name, or its name."""
    key = model_name_key(info.name)
    return f"sha256:{info.sha256}:{key}" if info.sha256 else f"name:{key}"


def model_id_of(
    connection: Connection,
    sql: Statements,
    info: wire.ModelInfo,
    known: KnownRows,
    learned: KnownRows,
    made_by: MadeBy,
) -> int:
    identity = model_identity(info)
    model_id = learned.models.get(identity) or known.models.get(identity)
    if model_id is None:
        values = {"name": info.name, "name_key": model_name_key(info.name), "sha256": info.sha256}
        keys = {"identity": identity}
        model_id = _get_or_insert(
            connection, sql, sql.model_by_identity, sql.insert_model, keys, values, made_by
        )
        learned.models[identity] = model_id
    return model_id


def facts_id_of(
    connection: Connection,
    sql: Statements,
    model_id: int,
    info: wire.ModelInfo,
    known: KnownRows,
    learned: KnownRows,
    made_by: MadeBy,
) -> int | None:
    """The row of the model's facts as this report states them (None: it states none)."""
    facts: dict[str, Any] = {f: getattr(info, f) for f in MODEL_FACTS}
    if all(value is None for value in facts.values()):
        return None
    layers = info.layers.model_dump_json() if info.layers is not None else None
    key = (model_id, (*facts.values(), layers))
    facts_id = learned.facts.get(key) or known.facts.get(key)
    if facts_id is None:
        if info.layers is not None:  # absent from the identity of the facts stored without
            facts["layers"] = info.layers.model_dump(mode="json")
        keys = {"model_id": model_id, "identity": build_identity(facts)}
        facts_id = _get_or_insert(
            connection, sql, sql.facts_by_identity, sql.insert_facts, keys, facts, made_by
        )
        learned.facts[key] = facts_id
    return facts_id


def over_series_bound(
    connection: Connection, sql: Statements, runs: Sequence[IncomingRun], limits: IngestLimits
) -> list[tuple[IncomingRun, ReportRefused]]:
    """The runs that would take their node's latest curves (this run's in place of its
    model's) past the bound: what placement, /metrics and the dashboard read per node. Runs
    of one batch count each other; batches stored at the same moment by other writers do not
    (the bound may be passed by one run per writer, never more)."""
    candidates = [run for run in runs if run.in_series]
    if not candidates:
        return []
    held: dict[int, dict[int, int]] = {}
    node_ids = sorted({run.node_id for run in candidates})
    for node_id, model_id, count in connection.execute(
        sql.latest_counts, {"node_ids": node_ids}
    ).all():
        held.setdefault(node_id, {})[model_id] = count
    refused = []
    for run in candidates:
        others = sum(c for m, c in held.get(run.node_id, {}).items() if m != run.model_id)
        total = others + len(run.report.points)
        if total > limits.max_series_per_node:
            message = (
                f"node {run.report.node!r} would hold {total} points in its latest curves "
                f"(this run's {len(run.report.points)} and {others} of its other models), "
                f"over this registry's limit of {limits.max_series_per_node} "
                "(FLEETBENCH_MAX_SERIES_PER_NODE)"
            )
            refused.append((run, ReportRefused(message)))
        else:  # the larger of the two: an older run does not replace the stored curve
            models = held.setdefault(run.node_id, {})
            models[run.model_id] = max(models.get(run.model_id, 0), len(run.report.points))
    return refused


@dataclass(frozen=True)
class StoredFingerprint:
    id: int
    memory_bytes: int | None
    description: str | None


Fingerprints = dict[tuple[int, str], StoredFingerprint]


def store_fingerprints(
    connection: Connection, sql: Statements, runs: Sequence[IncomingRun]
) -> Fingerprints:
    """(id, memory in bytes) by (node, hash) of the fingerprints the runs report, stored or
    widened to the runs' times: one upsert, one row per fingerprint."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for run in runs:
        hardware = run.report.hardware
        if hardware is None:
            continue
        seen = run.report.started_at
        row = rows.get((run.node_id, hardware.hash))
        if row is not None:
            row["first_seen"] = min(row["first_seen"], seen)
            row["last_seen"] = max(row["last_seen"], seen)
            continue
        summary = summarize_hardware(hardware.data)
        rows[(run.node_id, hardware.hash)] = {
            "node_id": run.node_id,
            "hash": hardware.hash,
            "data": hardware.data,
            "first_seen": seen,
            "last_seen": seen,
            "description": summary.description,
            "hardware_class": hardware_class(summary.description),
            "memory_bytes": summary.memory_bytes,
            "memory_kind": summary.memory_kind,
        }
    if not rows:
        return {}
    returned = connection.execute(sql.fingerprints, [rows[key] for key in sorted(rows)]).all()
    return {
        (node_id, digest): StoredFingerprint(int(id_), memory, description)
        for node_id, digest, id_, memory, description in returned
    }


def fingerprint_of(run: IncomingRun, fingerprints: Fingerprints) -> StoredFingerprint | None:
    hardware = run.report.hardware
    return fingerprints.get((run.node_id, hardware.hash)) if hardware is not None else None


def assign_ids(
    connection: Connection,
    sql: Statements,
    runs: Sequence[IncomingRun],
    *,
    taken: Collection[uuid.UUID] = (),
) -> None:
    """Gives each run the id it is stored under: its own, unless another node's run holds
    it (or a run earlier in the batch, or one of `taken`); then a fresh random one, which
    no node can claim ahead of it."""
    if not runs:
        return
    held = set(taken)
    held.update(
        row[0] for row in connection.execute(sql.taken_ids, {"run_ids": [r.id for r in runs]})
    )
    for run in runs:
        if run.id in held:
            run.id = uuid.uuid4()
        held.add(run.id)


def _new_runs_only(insert: Any) -> Any:
    # ON CONFLICT DO NOTHING (the id, or the node's own run id): RETURNING yields no row for
    # a conflict; PostgreSQL waits for a concurrent insert of the same key to commit or roll
    # back first.
    return insert.on_conflict_do_nothing().returning(table_of(Run).c.id)


def insert_runs(
    connection: Connection, sql: Statements, runs: Sequence[IncomingRun], fingerprints: Fingerprints
) -> set[uuid.UUID]:
    """Inserts the runs, their points and failed points; returns the ids it inserted (the
    others were stored meanwhile by another request)."""
    if not runs:
        return set()
    rows = []
    for run in runs:
        report = run.report
        fingerprint = fingerprint_of(run, fingerprints)
        on, why = run.on_accelerator
        rows.append(
            {
                "id": run.id,
                "reported_id": run.report.run_id,
                "node_id": run.node_id,
                "fingerprint_id": fingerprint.id if fingerprint else None,
                "build_id": run.build_id,
                "model_id": run.model_id,
                "facts_id": run.facts_id,
                "source": report.source,
                "agent": f"{report.agent.name} {report.agent.version}" if report.agent else None,
                "status": report.status,
                "error": report.error,
                "started_at": report.started_at,
                "finished_at": report.finished_at,
                "received_at": run.received_at,
                "report_sha256": run.digest,
                "kind": report.kind,
                "server": report.server.model_dump(mode="json") if report.server else None,
                "slo_search": report.slo_search.model_dump(mode="json")
                if report.slo_search
                else None,
                "engine_on_accelerator": on,
                "accelerator_note": why,
                "buffers": [b.model_dump(mode="json") for b in report.buffers] or None,
                "kv_predicted_bytes": predicted_kv_bytes(report),
                "kv_allocated_bytes": allocated_bytes(report.buffers, "kv"),
                "device_memory": [m.model_dump(mode="json") for m in report.device_memory] or None,
                "bandwidth": run.bandwidth.model_dump(mode="json") if run.bandwidth else None,
                "contention": report.contention.model_dump(mode="json")
                if report.contention
                else None,
                "contention_reason": run.contention_reason,
                "energy": report.energy.model_dump(mode="json") if report.energy else None,
                "outputs": report.outputs.model_dump(mode="json") if report.outputs else None,
                **report.settings.model_dump(),
            }
        )
    result = insert_rows(connection, table_of(Run), rows, _new_runs_only)
    inserted = {row[0] for row in result.all()} if result is not None else set()
    new = [run for run in runs if run.id in inserted]
    points = [
        {"run_id": r.id, **p.model_dump(), "mbu": limit.mbu, "impossible": limit.impossible}
        for r in new
        for p, limit in zip(r.report.points, r.limits, strict=True)
    ]
    insert_rows(connection, table_of(RunPoint), points)
    failures = [{"run_id": r.id, **f.model_dump()} for r in new for f in r.report.failures]
    insert_rows(connection, table_of(FailedPoint), failures)
    serving = [{"run_id": r.id, **p.model_dump()} for r in new for p in r.report.serving_points]
    insert_rows(connection, table_of(ServingPointRow), serving)
    return inserted
