"""The comparison as people read it: a table per point like llama.cpp's
compare-llama-bench.py (from, to, the ratio), as rows for the terminal or Markdown for a
pull request or a ticket."""

from __future__ import annotations

from fleetbench.registry.compare.answer import METRIC_NAMES, CompareAnswer, PointRatio

__all__ = ["CLASS_COLUMNS", "POINT_COLUMNS", "class_rows", "markdown", "point_rows"]

POINT_COLUMNS = ("node", "metric", "PP", "TG", "B", "from", "to", "ratio", "95% CI", "seen at")
CLASS_COLUMNS = ("hardware class", "verdict", "nodes", "why")


def _mark(point: PointRatio) -> str:
    """The ratio, flagged where the change is beyond what the runs tell from noise."""
    flag = ""
    if point.beyond_detection:
        flag = " worse" if point.worse_pct > 0 else " better"
    return f"{point.ratio:.3f}{flag}"


def point_rows(answer: CompareAnswer) -> list[tuple[str, ...]]:
    return [
        (
            node.node,
            METRIC_NAMES.get(p.metric, p.metric),
            str(p.pp),
            str(p.tg),
            str(p.b),
            f"{p.from_value:.2f}",
            f"{p.to_value:.2f}",
            _mark(p),
            f"{p.ratio_low:.3f}-{p.ratio_high:.3f}",
            f"{p.detectable_pct:.1f}%",
        )
        for node in answer.nodes
        for p in node.points
    ]


def class_rows(answer: CompareAnswer) -> list[tuple[str, ...]]:
    return [(c.hardware_class, c.verdict, str(c.nodes_compared), c.reason) for c in answer.classes]


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    escaped = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in escaped]


def markdown(answer: CompareAnswer) -> str:
    """The verdict, each hardware class's and each point's ratio, as Markdown."""
    before = ", ".join(answer.from_builds) or answer.from_build
    after = ", ".join(answer.to_builds) or answer.to_build
    lines = [
        f"## {answer.model}: {before} -> {after} ({answer.kind})",
        "",
        f"**Verdict: {answer.verdict}**: {answer.reason}",
        "",
        *_table(CLASS_COLUMNS, class_rows(answer)),
        "",
        *_table(POINT_COLUMNS, point_rows(answer)),
    ]
    if answer.nodes_compared > len(answer.nodes):
        lines += ["", f"The {len(answer.nodes)} worst of {answer.nodes_compared} nodes compared."]
    if answer.not_compared:
        lines += ["", "Not compared:", ""]
        lines += [f"- {n.node}: {n.reason}" for n in answer.not_compared]
    return "\n".join(lines) + "\n"
