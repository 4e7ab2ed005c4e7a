"""An output change between two runs on one node is a regression of its own (metric
`outputs`): the pure detector over literal series (one run beyond the series' own floor is a
shift; the floor, a return and a p99 or non-finite change), and through the registry on both
databases: found at the right run with its cause, listed and counted even where only the
probabilities moved, never across runners or offloads, stable when judged again, and kept
once acknowledged."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from fleetbench.contract import wire
from fleetbench.contract.outputs import OutputFingerprint, compare_outputs
from fleetbench.registry import crud
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import session_factory, write_transaction
from fleetbench.registry.models import Regression
from fleetbench.registry.notify import WebhookNotifier
from fleetbench.registry.regressions.judge import judge_checks
from fleetbench.registry.regressions.output_shifts import (
    HISTORY,
    OutputRun,
    OutputShift,
    find_output_shifts,
)
from fleetbench.registry.regressions.queue import Check
from fleetbench.registry.regressions.rules import SeriesRun
from fleetbench.registry.regressions.series import output_series_of_pairs
from tests.factories import (
    ARTICLE_MODEL,
    DAY0,
    LiveRegistry,
    Receiver,
    make_report,
    make_serving_report,
    post_report,
    running_registry,
)
from tests.registry.test_api_history import get
from tests.registry.test_compare import H100, gpu
from tests.registry.test_compare_outputs import fingerprint

MIN_KL = 0.01
SAME = fingerprint()
# every fourth of 40 positions has its top two tokens swapped: a kernel wrong on some tokens
WRONG = fingerprint(wrong_every=4)
SWAPPED = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6)  # KL at a swapped position
# the same top token everywhere, its probability 0.35 rather than 0.6: only the KL moves
FLATTER = fingerprint(0.35)


def _series(*taken: OutputFingerprint, hardware: list[str] | None = None) -> list[OutputRun]:
    return [
        OutputRun(
            SeriesRun(
                uuid.uuid4(), DAY0 + timedelta(hours=i), 0.0, "b1", None,
                (hardware or ["h"] * len(taken))[i], "",
            ),
            outputs,
        )
        for i, outputs in enumerate(taken)
    ]  # fmt: skip


def _shifts(runs: list[OutputRun], min_kl: float = MIN_KL) -> list[int]:
    found = find_output_shifts(runs, min_kl=min_kl)
    index = {run.run_id: i for i, run in enumerate(runs)}
    return [index[shift.first.run_id] for shift in found]


def test_one_run_beyond_the_floor_is_a_shift_with_its_figures() -> None:
    runs = _series(SAME, SAME, SAME, SAME, WRONG, WRONG)
    [shift] = find_output_shifts(runs, min_kl=MIN_KL)
    assert isinstance(shift, OutputShift)
    assert (shift.before_run, shift.first) == (runs[3].run, runs[4].run)
    assert shift.before == 0.0 and shift.after == pytest.approx(SWAPPED / 4)
    assert shift.change == pytest.approx(-0.25) and shift.is_regression
    assert (shift.runs_before, shift.runs_after, shift.cause_kinds) == (4, 1, ())
    assert shift.describe() == (
        f"outputs changed: KL mean {SWAPPED / 4:.4f} nats (floor 0.0000), p99 {SWAPPED:.4f} "
        "(floor 0.0000), top token the same at 75.0% of 40 positions; nothing known changed "
        "(same build, binding, hardware and settings): a failing device, or a driver or "
        "library the hardware fingerprint does not name"
    )
    # identical outputs, however many: nothing; each wrong run that goes back: one shift
    assert _shifts(_series(*[SAME] * 8)) == []
    assert _shifts(_series(SAME, SAME, SAME, WRONG, SAME, SAME, WRONG, SAME)) == [3, 6]
    # a driver update that changes them, rolled back: one shift, caused by the hardware
    rolled = _series(SAME, SAME, WRONG, WRONG, SAME, hardware=["550", "550", "555", "555", "550"])
    [update] = find_output_shifts(rolled, min_kl=MIN_KL)
    assert update.first is rolled[2].run and update.cause_kinds == ("hardware",)
    assert update.describe().endswith("; hardware or driver changed (550 -> 555)")


def test_the_floor_is_the_series_own_run_to_run_difference() -> None:
    # a GPU whose outputs differ a little run to run (0.60 against 0.63), under min_kl
    wobble = compare_outputs(fingerprint(0.6), fingerprint(0.63))
    assert wobble is not None and wobble.mean_kl < MIN_KL
    wobbling = [fingerprint(0.6), fingerprint(0.63)] * 3 + [fingerprint(0.6)]
    assert _shifts(_series(*wobbling)) == []
    # then 0.64: above min_kl, within twice the floor; with no history, a shift
    small = compare_outputs(fingerprint(0.6), fingerprint(0.64))
    assert small is not None and MIN_KL < small.mean_kl < 2 * wobble.mean_kl
    assert _shifts(_series(*wobbling, fingerprint(0.64))) == []
    assert _shifts(_series(fingerprint(0.6), fingerprint(0.64))) == [1]
    # beyond twice the floor: a shift, its floor the wobble
    [shift] = find_output_shifts(_series(*wobbling, fingerprint(0.66)), min_kl=MIN_KL)
    assert shift.before == pytest.approx(wobble.mean_kl) and shift.runs_before == 7
    assert shift.after > 2 * wobble.mean_kl
    # outputs that flip beyond min_kl (a failing device): each flip away is a finding, each
    # flip back a return; a flip never becomes the floor
    flipping = [fingerprint(0.6), fingerprint(0.66)] * 3
    assert _shifts(_series(*flipping)) == [1, 3, 5]
    # a new driver's difference (under min_kl) is no run-to-run floor: what moves after it
    # by more than min_kl, if less than twice it, is a shift
    after = compare_outputs(fingerprint(0.63), fingerprint(0.662))
    assert after is not None and MIN_KL < after.mean_kl < 2 * wobble.mean_kl
    updated = [fingerprint(0.6), fingerprint(0.63), fingerprint(0.662)]
    assert _shifts(_series(*updated, hardware=["550", "555", "555"])) == [2]
    assert _shifts(_series(*updated)) == []


def test_a_few_positions_far_or_logits_no_numbers_are_a_shift() -> None:
    one_in_forty = fingerprint(wrong_every=40)
    moved = compare_outputs(SAME, one_in_forty)
    assert moved is not None and moved.mean_kl < MIN_KL < 10 * MIN_KL < moved.p99_kl
    assert _shifts(_series(SAME, SAME, one_in_forty)) == [2]
    broken = SAME.model_copy(update={"non_finite": 12})
    [shift] = find_output_shifts(_series(SAME, SAME, broken), min_kl=MIN_KL)
    assert (shift.after, shift.change) == (0.0, 0.0) and shift.is_regression
    assert shift.describe().startswith(
        "outputs changed: 12 positions' logits newly no numbers (NaN, inf); KL mean 0.0000"
    )
    # still broken on the next run: nothing new
    assert _shifts(_series(SAME, SAME, broken, broken)) == [2]


def test_judged_run_by_run_or_in_a_burst_the_same_shifts() -> None:
    runs = _series(SAME, SAME, WRONG, SAME, SAME, FLATTER, FLATTER, WRONG, SAME)
    at_once = [s.first.run_id for s in find_output_shifts(runs, min_kl=MIN_KL)]
    one_by_one: list[uuid.UUID] = []
    for i in range(1, len(runs)):
        known = [j for j, r in enumerate(runs[:i]) if r.run_id in one_by_one]
        found = find_output_shifts(runs[: i + 1], min_kl=MIN_KL, judge_from=i, known_steps=known)
        one_by_one += [s.first.run_id for s in found]
    # the wrong run (back after it), the flatter outputs that stay, a wrong run after them,
    # then the first outputs: not those before that wrong run (the flatter ones), a shift
    assert at_once == one_by_one == [runs[i].run_id for i in (2, 5, 7, 8)]


# --- through the registry ------------------------------------------------------------------

START = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)  # recent: webhooks go


def _report(
    node: str, hour: int, outputs: OutputFingerprint | None, driver: str = "550.54.15", **more: Any
) -> wire.RunReport:
    report = make_report(
        node=node, started_at=START + timedelta(hours=hour), hardware=gpu(H100, node, driver)
    )
    return report.model_copy(update={"outputs": outputs, **more})


def _post(registry: LiveRegistry, *reports: wire.RunReport) -> None:
    with registry.client(registry.token(reports[0].node)) as client:
        for report in reports:
            assert post_report(client, report).status_code == 201


def _outputs_found(registry: LiveRegistry, **params: object) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get(registry, "/v1/regressions", **params)["data"]
    return found


def test_a_driver_update_that_changes_the_outputs_is_a_regression_with_its_cause(
    live_registry: LiveRegistry,
) -> None:
    offload = wire.RunSettings(n_gpu_layers=0)
    reports = [
        *[_report("h100-0", hour, SAME) for hour in range(4)],
        _report("h100-0", 4, None),  # no fingerprint: not in the series
        _report("h100-0", 5, WRONG, settings=offload),  # on the CPU: another series
        _report("h100-0", 6, WRONG, driver="555.42.02"),  # the driver update
        _report("h100-0", 7, WRONG, driver="555.42.02"),
    ]
    _post(live_registry, *reports)
    [found] = _outputs_found(live_registry)  # no speed moved
    assert (found["metric"], found["pp"], found["tg"], found["b"]) == ("outputs", 0, 0, 0)
    assert (found["kind"], found["first_run_id"]) == ("regression", str(reports[6].run_id))
    assert found["before"] == 0.0 and found["after"] == pytest.approx(SWAPPED / 4)
    assert (found["change_pct"], found["noise_pct"], found["confidence"]) == (-25.0, 0.0, 1.0)
    assert (found["runs_before"], found["runs_after"]) == (4, 1)
    assert found["min_detectable_change_pct"] is None
    assert found["cause_kinds"] == ["hardware"]
    assert found["cause"].startswith(f"outputs changed: KL mean {SWAPPED / 4:.4f} nats")
    assert "; hardware or driver changed (" in found["cause"] and "555.42.02" in found["cause"]
    with session_factory(live_registry.engine)() as session:
        [row] = session.scalars(select(Regression)).all()
        assert row.before_run_id == reports[3].run_id  # past the run without a fingerprint
    [node] = get(live_registry, "/v1/nodes")["data"]
    assert (node["health"], node["open_regressions"]) == ("regressed", 1)


def test_two_configurations_of_one_model_on_a_node_are_two_series(
    live_registry: LiveRegistry,
) -> None:
    # a node sweeping one model twice a day, with flash attention and without: each
    # configuration's outputs its own (here far apart), neither a shift from the other's
    reports = []
    for hour in range(8):
        report = _report("h100-2", hour, WRONG if hour % 2 else SAME)
        if hour % 2:
            flash = report.settings.model_copy(update={"flash_attn": "on"})
            report = report.model_copy(update={"settings": flash})
        reports.append(report)
    _post(live_registry, *reports)
    assert _outputs_found(live_registry) == []


def test_outputs_moved_with_nothing_known_changed_are_listed_counted_and_sent(
    live_registry: LiveRegistry, receiver: Receiver
) -> None:
    _post(live_registry, *[_report("h100-1", hour, SAME) for hour in range(3)])
    _post(live_registry, _report("h100-1", 3, FLATTER))
    # every top token the same (change 0), only the probabilities moved: still a regression
    [found] = _outputs_found(live_registry)
    assert (found["kind"], found["change_pct"], found["cause_kinds"]) == ("regression", 0.0, [])
    assert "top token the same at 100.0% of 40 positions; nothing known changed" in found["cause"]
    assert _outputs_found(live_registry, min_change=50) == [found]  # no speed scale to it
    [node] = get(live_registry, "/v1/nodes")["data"]
    assert node["open_regressions"] == 1
    sessions = session_factory(live_registry.engine)
    notifier = WebhookNotifier(sessions, url=receiver.url, public_url="http://x")
    try:
        assert notifier.deliver_due() == 1
    finally:
        notifier.stop()
    [sent] = receiver.bodies
    assert sent["regression"]["metric"] == "outputs"
    assert sent["url"] == f"http://x/curves?node=h100-1&model={ARTICLE_MODEL}"


def test_the_registry_holds_outputs_to_its_configured_least(
    registry_settings: RegistrySettings,
) -> None:
    # FLATTER moved the KL by 0.198 nats: under a least of 0.5, no shift; logits that are
    # no numbers are one whatever the least
    lenient = registry_settings.model_copy(update={"compare_outputs_min_kl": 0.5})
    broken = _report("h100-1", 4, FLATTER.model_copy(update={"non_finite": 3}))
    with running_registry(lenient) as registry:
        _post(registry, *[_report("h100-1", hour, SAME) for hour in range(3)])
        _post(registry, _report("h100-1", 3, FLATTER))
        assert _outputs_found(registry) == []
        _post(registry, broken)
        [found] = _outputs_found(registry)
        assert (found["first_run_id"], found["after"]) == (str(broken.run_id), 0.0)


def _judge_again(live_registry: LiveRegistry, node: str) -> None:
    """Judges the node's whole series again, as a check from its first run would."""
    sessions = session_factory(live_registry.engine)
    with sessions() as session, write_transaction(session):
        found = crud.find_node(session, node)
        assert found is not None
        [model] = {r.model_id for r in session.scalars(select(Regression))}
        judge_checks(session, [Check(found.id, model, "offline", START)])
        session.commit()


def test_judged_again_a_shift_stays_one_row_and_an_acknowledged_one_stays(
    live_registry: LiveRegistry,
) -> None:
    for node in ("acked", "open"):
        _post(live_registry, *[_report(node, hour, SAME) for hour in range(4)])
        _post(live_registry, _report(node, 6, WRONG))
    first = {r["node"]: r for r in _outputs_found(live_registry)}
    _judge_again(live_registry, "acked")
    assert {r["node"]: r for r in _outputs_found(live_registry)} == first  # the same rows
    with live_registry.client(live_registry.scoped_token("admin", "ops")) as client:
        done = client.post(
            f"/v1/regressions/{first['acked']['id']}/acknowledge", json={"note": "new driver"}
        )
        assert done.status_code == 200, done.text
    # a run sent late, before the wrong one and as wrong: the shift is there now
    for node in ("acked", "open"):
        _post(live_registry, _report(node, 5, WRONG))
    now = {(r["node"], r["first_run_id"]): r for r in _outputs_found(live_registry)}
    assert {node for node, _ in now} == {"acked", "open"}
    assert (("open", first["open"]["first_run_id"])) not in now  # withdrawn: not a shift now
    everything = _outputs_found(live_registry, include_acknowledged=True)
    acknowledged = [r for r in everything if r["acknowledged_at"] is not None]
    assert [r["id"] for r in acknowledged] == [first["acked"]["id"]]  # kept, once
    assert len(everything) == 3


def test_serving_runs_fingerprints_are_a_series_of_their_own(live_registry: LiveRegistry) -> None:
    def served(hour: int, outputs: OutputFingerprint) -> wire.RunReport:
        return make_serving_report(
            node="h100-2", model=ARTICLE_MODEL, points=[(1, 30.0, 28.0, 90.0)],
            started_at=START + timedelta(hours=hour), outputs=outputs,
        )  # fmt: skip

    # a server's outputs (one token a request) are not the in-process runner's (32 a batch)
    runs = [served(2 * hour + 1, WRONG) for hour in range(3)]
    offline = [_report("h100-2", 2 * hour, SAME) for hour in range(3)]
    _post(live_registry, *[r for pair in zip(offline, runs, strict=True) for r in pair])
    assert _outputs_found(live_registry) == []  # each kind agrees with itself
    changed = served(7, SAME)
    _post(live_registry, changed)
    [found] = _outputs_found(live_registry)
    assert (found["first_run_id"], found["cause_kinds"]) == (str(changed.run_id), [])


def test_the_read_is_bounded_and_skipped_without_a_new_fingerprint(
    live_registry: LiveRegistry,
) -> None:
    reports = [_report("h100-3", hour, SAME) for hour in range(HISTORY + 4)]
    _post(live_registry, *reports, _report("h100-3", 20, None))
    with session_factory(live_registry.engine)() as session:
        node = crud.find_node(session, "h100-3")
        assert node is not None
        [model] = {m.id for m, _, _ in crud.list_models(session)}
        pair = (node.id, model)
        latest = output_series_of_pairs(session, {pair: reports[-1].started_at})
        [runs] = latest[pair].values()
        assert [r.run_id for r in runs] == [r.run_id for r in reports[-HISTORY - 1 :]]
        # the run without one brought nothing to judge: nothing read
        assert output_series_of_pairs(session, {pair: START + timedelta(hours=20)}) == {}
