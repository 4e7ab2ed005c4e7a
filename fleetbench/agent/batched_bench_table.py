"""The lines of a llama-batched-bench table as people post them: the header in every
spelling the tool has printed since 2023 (with columns its author dropped, or added: those
are read past and named), rows, markdown alignment rows, a table whose line
breaks a feed or a paste turned into spaces, and other tools' tables, named as such. Pure:
a line in, its cells and what they are out."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Header", "NotOurs", "header_of", "rows_of"]

# A header cell, lowercased with spaces and brackets removed -> the Point field it holds.
# `PL` (parallel sequences) is what the tool called B until late 2023; units are printed
# bare (`T_PP s`), in parentheses (`T_PP (s)`) or left out.
_SPELLINGS = {
    "pp": "pp",
    "tg": "tg",
    "b": "b",
    "pl": "b",
    "n_kv": "n_kv",
    "t_pp": "t_pp",
    "t_pps": "t_pp",
    "s_pp": "s_pp",
    "s_ppt/s": "s_pp",
    "t_tg": "t_tg",
    "t_tgs": "t_tg",
    "s_tg": "s_tg",
    "s_tgt/s": "s_tg",
    "t": "t",
    "ts": "t",
    "s": "s",
    "st/s": "s",
}
_UNSPELLED = re.compile(r"[\s()\[\]]")
# Columns of llama-bench's table (`| model | size | params | backend | ngl | test | t/s |`).
_LLAMA_BENCH = {"model", "test", "t/s"}


@dataclass(frozen=True)
class Header:
    """A llama-batched-bench header: the Point field of each column, in order, None for a
    column its author added (`GPU temp`), read past and named in `left_out`."""

    columns: list[str | None]
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotOurs:
    """A table header that is not llama-batched-bench's, or one of its headers that names a
    column twice, and why."""

    reason: str
    ours: bool  # a batched-bench header naming a column twice: an error


def header_of(cells: list[str]) -> Header | NotOurs:
    """What a row of cells is as a header."""
    keys = [_SPELLINGS.get(_UNSPELLED.sub("", cell.lower())) for cell in cells]
    known = {k for k in keys if k is not None}
    if {"pp", "tg", "b"} <= known:
        unknown = [cell for cell, key in zip(cells, keys, strict=True) if key is None]
        if not all(unknown):
            return NotOurs("a table of PP, TG and B with a column without a name", False)
        if len(known) < len(keys) - len(unknown):
            return NotOurs("a llama-batched-bench header naming a column twice", True)
        if not {"s_tg", "t_tg"} & known:
            return NotOurs("a llama-batched-bench header without S_TG or T_TG", False)
        # A column its author added is read past, never the reason to refuse the table.
        return Header(keys, tuple(unknown))
    lowered = {c.lower() for c in cells}
    if lowered >= _LLAMA_BENCH:
        return NotOurs("a llama-bench table, not llama-batched-bench's", False)
    if {"pp", "tg"} <= known:
        return NotOurs("a table of PP and TG without B: not llama-batched-bench's", False)
    shown = ", ".join(c for c in cells[:6] if c) + (", ..." if len(cells) > 6 else "")
    return NotOurs(f"a table of other columns ({shown})", False)


def rows_of(line: str) -> list[list[str] | None]:
    """The rows a `|`-line holds, each as its cells, None for a |---|---| alignment row:
    one, or several where line breaks were lost (`| a | b | | c | d |`: an empty cell
    between two pipes is where one row ended and the next began)."""
    # Text after the closing pipe is not a cell (reports sometimes run prose into a row).
    end = line.rindex("|") if line.count("|") > 1 else len(line)
    cells = [c.strip() for c in line[1:end].split("|")]
    rows: list[list[str]] = [[]]
    for cell in cells:
        if cell:
            rows[-1].append(cell)
        elif rows[-1]:
            rows.append([])
    rows = [row for row in rows if row]
    if len(rows) <= 1:
        rows = [cells]  # one row: its cells as printed, empty ones included
    return [None if all(set(c) <= set("-: ") for c in row) else row for row in rows]
