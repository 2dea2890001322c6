"""The measuring rule every scenario shares: a warm-up run, then repeats within a time budget."""

from __future__ import annotations

from typing import Callable, Optional


Outcome = tuple[dict, list[dict], Optional[str]]


def cpu_seconds(client=None) -> float:
    """CPU seconds (user + system, all threads) used so far by this process, plus those of ``client``'s
    workers (a ``LocalCluster``'s scheduler runs in this process: counted here)."""
    import psutil

    def used() -> float:
        times = psutil.Process().cpu_times()
        return times.user + times.system

    return used() + (sum(client.run(used).values()) if client is not None else 0.0)


def repeated_runs(once: Callable[[], dict], repeats: int, budget: float) -> Outcome:
    """``(warm-up, measured runs, failure reason or None)``; slow tools get fewer repeats (at least one)."""
    return interleaved_runs({"": once}, repeats, budget)[""]


def interleaved_runs(once: dict[str, Callable[[], dict]], repeats: int, budget: float) -> dict[str, Outcome]:
    """:func:`repeated_runs` for several tools at once, their measured runs taken in rounds
    (one run of each tool a round) so that a machine whose speed drifts over minutes -- a
    shared or virtual host does -- slows every tool alike, and their ratios stay fair."""
    warm = {tool: run() for tool, run in once.items()}
    reps = {}
    for tool, w in warm.items():
        if w.get("status") == "ok":
            reps[tool] = repeats if w["seconds"] * repeats <= budget else max(
                1, int(budget // max(w["seconds"], 1e-9)))
    runs: dict[str, list[dict]] = {tool: [] for tool in once}
    for round_ in range(max(reps.values(), default=0)):
        for tool, n in reps.items():
            if round_ < n:
                runs[tool].append(once[tool]())
    outcome = {}
    for tool, w in warm.items():
        if w.get("status") != "ok":
            outcome[tool] = (w, [], w.get("reason"))
            continue
        failed = [r for r in runs[tool] if r.get("status") != "ok"]
        reason = (failed[0].get("reason") or "failed") + " (in a repeat)" if failed else None
        outcome[tool] = (w, runs[tool], reason)
    return outcome


TABLE_HEADER = ["| tool | seconds (median) | x raw limit | daskcfa / tool | answer | notes |",
                "|---|---|---|---|---|---|"]


def cannot_row(label: str, reason: str) -> str:
    return f"| {label} | - | - | - | cannot do this ({reason}) | |"


def runs_note(times: list[float], fmt: Callable[[float], str], unit: str = "") -> str:
    """``"3 runs, 0.51-0.53 s"``: how many measured runs and their spread."""
    n = len(times)
    return f"{n} run{'s' if n > 1 else ''}, {fmt(min(times))}-{fmt(max(times))}{unit}"
