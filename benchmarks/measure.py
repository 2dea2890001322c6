"""The measuring rule every scenario shares: a warm-up run, then repeats within a time budget."""

from __future__ import annotations

from typing import Callable


def repeated_runs(once: Callable[[], dict], repeats: int, budget: float) -> tuple[dict, list[dict], str | None]:
    """``(warm-up, measured runs, failure reason or None)``; slow tools get fewer repeats (at least one)."""
    warm = once()
    if warm.get("status") != "ok":
        return warm, [], warm.get("reason")
    reps = repeats
    if warm["seconds"] * reps > budget:
        reps = max(1, int(budget // max(warm["seconds"], 1e-9)))
    runs = [once() for _ in range(reps)]
    failed = [r for r in runs if r.get("status") != "ok"]
    if failed:
        return warm, runs, (failed[0].get("reason") or "failed") + " (in a repeat)"
    return warm, runs, None


TABLE_HEADER = ["| tool | seconds (median) | x raw limit | daskcfa / tool | answer | notes |",
                "|---|---|---|---|---|---|"]


def cannot_row(label: str, reason: str) -> str:
    return f"| {label} | - | - | - | cannot do this ({reason}) | |"


def runs_note(times: list[float], fmt: Callable[[float], str], unit: str = "") -> str:
    """``"3 runs, 0.51-0.53 s"``: how many measured runs and their spread."""
    n = len(times)
    return f"{n} run{'s' if n > 1 else ''}, {fmt(min(times))}-{fmt(max(times))}{unit}"
