"""The rollout (compare) page in Chromium on energy: a build that costs more energy per
token, its points named so in the table and its class's efficiency shown with its verdict."""

from __future__ import annotations

from fleetbench.agent.importer import declared_hardware
from tests.factories import ARTICLE_MODEL, ARTICLE_TABLE
from tests.web.conftest import Dashboard, Fleet, hours_ago
from tests.web.test_curves_page import H100, NVML, energy_points

OLD, NEW = 11429, 11500
A100 = "NVIDIA A100-SXM4-80GB"
# Each node's runs of a build, a little apart: speeds and joules within 1% of each other.
NOISE = [1.0, 1.01, 0.99]


def test_a_build_costing_more_energy_per_token_is_shown_beside_its_verdict(
    dashboard: Dashboard, fleet: Fleet
) -> None:
    # The same speeds on both builds; on the H100s the new one draws 0.6 J a generated token
    # against the old one's 0.5 (20% more); the A100 counts no energy.
    hour = 48
    for node, card in (("h100-0", H100), ("h100-1", H100), ("h100-2", H100), ("a100-0", A100)):
        for build, joules_per_token in ((OLD, 0.5), (NEW, 0.6)):
            for factor in NOISE:
                hour -= 1
                table = [(b, s_pp * factor, s_tg * factor) for b, s_pp, s_tg in ARTICLE_TABLE]
                joules = [b * 128 * joules_per_token * factor for b, _, _ in ARTICLE_TABLE]
                energy = (
                    {"energy": NVML, "points": energy_points(table, joules)}
                    if card == H100
                    else {"table": table}
                )
                fleet.report(
                    node,
                    build_number=build,
                    hardware=declared_hardware(card),
                    started_at=hours_ago(hour),
                    **energy,
                )

    page = dashboard.open(f"/compare?model={ARTICLE_MODEL}&from_build=b{OLD}&to_build=b{NEW}")
    api = fleet.get("/v1/compare", model=ARTICLE_MODEL, from_build=f"b{OLD}", to_build=f"b{NEW}")
    efficiency = {c["hardware_class"]: c["efficiency"] for c in api["classes"]}
    assert efficiency[A100] is None
    assert efficiency[H100].startswith("energy per token at B=1 (PP 512, TG 128) 20.0% more")
    # More energy is shown, not a hold: both classes go, the H100s marked and told why.
    assert [row[:3] for row in dashboard.table("#classes")] == [
        [A100, "go", "1"],
        [H100, "go more energy per token", "3"],
    ]
    assert (
        page.text_content("#classes tr[data-class='NVIDIA H100 80GB HBM3'] p.efficiency")
        == (efficiency[H100])
    )
    assert page.locator("#classes p.efficiency").count() == 1
    rows = dashboard.table("#points")
    energy_at_16 = next(r for r in rows if r[:2] == ["h100-0", "energy per token"] and r[3] == "16")
    assert energy_at_16[4:7] == ["0.5000", "0.6000", "1.200 worse"]
    assert not any(r[1] == "energy per token" for r in rows if r[0] == "a100-0")
    dashboard.screenshot("compare-energy")
    dashboard.assert_clean()
