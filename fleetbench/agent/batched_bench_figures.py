"""The figures a llama-batched-bench row implies but does not print: times from speeds (and
back), where they follow exactly, rounding mended, and the KV layout N_KV shows. Pure."""

from __future__ import annotations

from fleetbench.contract.kv_cache import kv_cells
from fleetbench.contract.wire import S_TG_TOLERANCE, Point, RunSettings

__all__ = ["derived_figures", "with_kv_layout"]


def with_kv_layout(settings: RunSettings, points: list[Point]) -> RunSettings:
    """Shared prompt and unified KV cache, where N_KV shows them: with B > 1 sequences, only a
    shared prompt in a unified cache uses PP + B*TG cells (batched-bench's n_ctx_req)."""
    if settings.kv_unified is not None:
        return settings
    for p in points:
        if p.b > 1 and p.pp > 0 and p.n_kv == kv_cells(p.pp, p.tg, p.b, shared=True, unified=True):
            return settings.model_copy(update={"pp_shared": True, "kv_unified": True})
        separate = kv_cells(p.pp, p.tg, p.b, shared=False, unified=False)
        if p.b > 1 and settings.pp_shared and p.n_kv == separate:
            return settings.model_copy(update={"kv_unified": False})
    return settings


def derived_figures(
    values: dict[str, float | int | None], settings: RunSettings, decimals: dict[str, int]
) -> dict[str, float | int | None]:
    v = dict(values)
    b, pp, tg = int(v["b"] or 0), int(v["pp"] or 0), int(v["tg"] or 0)

    shared = settings.pp_shared
    if b == 1:
        shared = False  # one sequence: shared and separate prompts are the same work
    elif shared is None and v.get("n_kv") == kv_cells(pp, tg, b, shared=True, unified=True):
        shared = True  # only a shared prompt in a unified KV cache uses PP + B*TG cells

    decode_tokens = b * tg
    _fill_rate(v, "t_tg", "s_tg", decode_tokens)
    _mend_rounding(v, "t_tg", "s_tg", decode_tokens, decimals)
    if shared is not None:
        prompt_tokens = pp if shared else b * pp
        _fill_rate(v, "t_pp", "s_pp", prompt_tokens)
        if v.get("t") is None and v.get("t_pp") is not None and v.get("t_tg") is not None:
            v["t"] = float(v["t_pp"]) + float(v["t_tg"])  # type: ignore[arg-type]
        _fill_rate(v, "t", "s", prompt_tokens + decode_tokens)
        if v.get("n_kv") is None and not shared:
            v["n_kv"] = kv_cells(pp, tg, b, shared=False, unified=False)
    return v


def _fill_rate(v: dict[str, float | int | None], time: str, speed: str, tokens: int) -> None:
    """speed = tokens / time: fill whichever of the two is missing."""
    t, s = v.get(time), v.get(speed)
    if t is None and s:
        v[time] = tokens / s
    elif s is None and t:
        v[speed] = tokens / t


def _mend_rounding(
    v: dict[str, float | int | None],
    time: str,
    speed: str,
    tokens: int,
    decimals: dict[str, int],
) -> None:
    """The table prints times to 3 decimals and speeds to 2: on short runs (the time) or on
    slow machines (the speed: 0.16 t/s for 5 tokens in 30.895 s) rounding alone can move
    tokens/time past the 1% the wire format allows. Where one figure's printed precision
    explains the gap, that figure is taken from the other, more precise one."""
    t, s = v.get(time), v.get(speed)
    if not t or not s or not tokens or time not in decimals or speed not in decimals:
        return
    from_time = tokens / t
    if abs(s - from_time) / from_time <= S_TG_TOLERANCE:
        return
    if abs(tokens / s - t) <= 0.5 * 10 ** -decimals[time]:
        v[time] = tokens / s
    elif abs(from_time - s) <= 0.5 * 10 ** -decimals[speed]:
        v[speed] = from_time
