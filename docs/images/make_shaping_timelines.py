"""Draw the timeline pictures of docs/shaping.md: one SVG per mode of shaping
(shaping-rate.svg, shaping-cooldown.svg, shaping-coalesce.svg, shaping-debounce.svg).

    .venv/bin/python docs/images/make_shaping_timelines.py [--out DIR]

Each picture shows calls arriving on a time axis and the runs that start. The runs
are not drawn by hand: a few lines below replay each mode's rule (a sliding window,
a cooldown after each run, one pending slot, a quiet period) on the calls, so the
picture follows the documented behaviour. Needs matplotlib (``scripts/docs``
installs the ``docs`` dependency group); written with benchmarks/plot.py's settings, so
the same input gives the same bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

OUT = Path(__file__).resolve().parent
RUN = "#2e7d32"  # a run of the call's own
LATER = "#81c784"  # a run that starts later than its call (deferred, pending, due)
REFUSED = "#c0392b"
PENDING = "#e67e22"
SPAN = "#d5d8dc"  # a window, a cooldown, a quiet period
CALLS_Y, RUNS_Y = 1.0, 0.0
BAR = 0.34  # height of a run's bar


def _axes(title: str, end: float, start: float = -0.5) -> tuple[Figure, Axes]:
    fig, ax = plt.subplots(figsize=(9.0, 2.7))
    ax.set_xlim(start, end)
    ax.set_ylim(-0.75, 1.55)
    ax.set_yticks([RUNS_Y, CALLS_Y], ["runs", "calls"])
    ax.set_xlabel("time (s)")
    ax.set_title(title, fontsize=11, loc="left")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#eeeeee", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def _call(ax: Axes, t: float, label: str, color: str = RUN, marker: str = "v") -> None:
    ax.plot([t], [CALLS_Y], marker=marker, color=color, markersize=8, linestyle="none")
    ax.text(t, CALLS_Y + 0.16, label, ha="center", va="bottom", fontsize=9)


def _run(ax: Axes, start: float, length: float, label: str, color: str = RUN) -> None:
    ax.barh(RUNS_Y, length, left=start, height=BAR, color=color, edgecolor="black", lw=0.6)
    ax.text(start + length / 2, RUNS_Y, label, ha="center", va="center", fontsize=8.5)


def _link(ax: Axes, t_call: float, t_run: float, color: str, dashed: bool = False) -> None:
    """A line from a call down to the start of the run it became."""
    ax.annotate(
        "",
        xy=(t_run, RUNS_Y + BAR / 2),
        xytext=(t_call, CALLS_Y - 0.08),
        arrowprops={
            "arrowstyle": "->",
            "color": color,
            "lw": 0.9,
            "linestyle": "--" if dashed else "-",
            "shrinkA": 0,
            "shrinkB": 0,
        },
    )


def _span(ax: Axes, start: float, end: float, label: str, y: float = RUNS_Y) -> None:
    ax.barh(y, end - start, left=start, height=BAR, color=SPAN, hatch="///", edgecolor="#aab0b6")
    ax.text((start + end) / 2, y - BAR / 2 - 0.05, label, ha="center", va="top", fontsize=8)


def _note(fig: Figure, text: str) -> None:
    fig.text(0.01, -0.07, text, ha="left", va="top", fontsize=8.5, color="#333333")


def rate_starts(
    calls: Sequence[float], count: int, window: float
) -> list[tuple[float, float, bool]]:
    """Replay ``rate=(count, window)`` with ``on_limited="defer"``: for each call (arrival
    time), when it starts and whether it was deferred. A start at *t* is admitted while
    fewer than *count* starts lie in ``(t - window, t]``; a refused call comes back when
    the oldest of them leaves the window."""
    starts: list[float] = []
    out: list[tuple[float, float, bool]] = []
    for arrival in calls:
        t, deferred = arrival, False
        while True:
            inside = sorted(s for s in starts if t - window < s <= t)
            if len(inside) < count:
                break
            t, deferred = inside[0] + window, True
        starts.append(t)
        out.append((arrival, t, deferred))
    return out


def rate() -> Figure:
    count, window, length = 3, 10.0, 0.7
    calls = [6.0, 7.0, 8.5, 10.0, 12.0, 19.5]
    fig, ax = _axes(
        f'rate="{count}/{window:.0f}s": at most {count} starts in any {window:.0f} s', 22
    )
    replay = rate_starts(calls, count, window)
    for (arrival, start, deferred), label in zip(replay, "abcdef", strict=True):
        if deferred:
            _call(ax, arrival, label, REFUSED, marker="x")
            _run(ax, start, length, label, LATER)
            _link(ax, arrival, start, REFUSED, dashed=True)
        else:
            _call(ax, arrival, label)
            _run(ax, start, length, label)
            _link(ax, arrival, start, RUN)
    first_refused = next(arrival for arrival, _, deferred in replay if deferred)
    ax.annotate(
        "",
        xy=(first_refused, -0.55),
        xytext=(first_refused - window, -0.55),
        arrowprops={"arrowstyle": "<->", "color": "#555555", "lw": 0.8},
    )
    ax.text(
        first_refused - window / 2,
        -0.5,
        f"the {window:.0f} s before d hold {count} starts (a, b, c): d is refused",
        ha="center",
        va="bottom",
        fontsize=8,
    )
    _note(
        fig,
        'x = refused: with on_limited="defer" (a task\'s default) the call is sent again '
        "for when the oldest start leaves the window\n"
        "(dashed: d runs at 16 s, when a leaves, e at 17 s); "
        '"skip" drops it, "raise" fails it; a view answers 429 with Retry-After.',
    )
    return fig


def cooldown() -> Figure:
    rest, length = 5.0, 2.0
    calls = [("a", 0.0), ("b", 3.0), ("c", 10.5)]
    fig, ax = _axes(f"cooldown={rest:.0f}: the key rests {rest:.0f} s after each run", 21)
    free_at = 0.0  # when the key's cooldown ends
    for label, arrival in calls:
        start = max(arrival, free_at)
        waited = start > arrival
        _call(ax, arrival, label, REFUSED if waited else RUN, "x" if waited else "v")
        _run(ax, start, length, label, LATER if waited else RUN)
        _link(ax, arrival, start, REFUSED if waited else RUN, dashed=waited)
        _span(ax, start + length, start + length + rest, f"cooldown {rest:.0f} s")
        free_at = start + length + rest
    _note(
        fig,
        "x = a call in the cooldown: deferred to its end (dashed; a task's default), "
        'or skipped with on_limited="skip".\nThe cooldown is set before the lock is '
        "released, so runs never overlap and start at least 5 s + a run's length apart.",
    )
    return fig


def coalesce() -> Figure:
    fig, ax = _axes("coalesce=True: one running, at most one pending per key", 14)
    first_end, later_len = 6.0, 3.5
    _call(ax, 0.0, "a")
    _run(ax, 0.0, first_end, "run a")
    _link(ax, 0.0, 0.0, RUN)
    during = [("b", 1.0), ("c", 2.0), ("d", 2.6), ("e", 3.5), ("f", 4.6)]
    for label, t in during:
        _call(ax, t, label, PENDING, marker="o")
    last = during[-1][0]
    slot_y = 0.55
    ax.barh(
        slot_y,
        first_end - during[0][1],
        left=during[0][1],
        height=0.16,
        color=PENDING,
        alpha=0.35,
        edgecolor=PENDING,
    )
    ax.text(
        during[0][1],
        slot_y + 0.11,
        f"pending slot: {during[0][0]}, replaced by each later call; at the end {last}'s arguments",
        ha="left",
        va="bottom",
        fontsize=8,
    )
    handoff = first_end + 0.1
    _run(ax, handoff, later_len, f"run {last}", LATER)
    ax.annotate(
        "",
        xy=(handoff, RUNS_Y + BAR / 2),
        xytext=(first_end, slot_y - 0.08),
        arrowprops={"arrowstyle": "->", "color": PENDING, "lw": 0.9},
    )
    _call(ax, 11.0, "g")
    _run(ax, 11.0, 2.0, "run g")
    _link(ax, 11.0, 11.0, RUN)
    _note(
        fig,
        f"o = a call that finds the key held: it pends (its task ends skipped). When run a ends "
        f"it hands its lock straight to\none new run with the last call's ({last}'s) "
        "arguments. g comes when the key is free: it runs at once.",
    )
    return fig


def debounce() -> Figure:
    quiet, length = 2.0, 1.2
    bursts = [[round(0.1 * i, 1) for i in range(10)], [7.0, 7.1, 7.2]]
    fig, ax = _axes(f"debounce={quiet:.0f}: one run once the key was quiet for {quiet:.0f} s", 12)
    due_y = 0.5
    labels = iter("abcdefghijklmnopqrstuvwxyz")
    for burst in bursts:
        names = [next(labels) for _ in burst]
        for t in burst:
            ax.plot([t], [CALLS_Y], marker="|", color=PENDING, markersize=12, mew=1.4)
            ax.plot([t + quiet], [due_y], marker="|", color="#999999", markersize=8)
        ax.text(burst[0], CALLS_Y + 0.16, names[0], ha="center", va="bottom", fontsize=9)
        if len(burst) > 1:
            ax.text(burst[-1], CALLS_Y + 0.16, names[-1], ha="center", va="bottom", fontsize=9)
        due = burst[-1] + quiet
        ax.annotate(
            "",
            xy=(due, due_y),
            xytext=(burst[0] + quiet, due_y),
            arrowprops={"arrowstyle": "->", "color": "#777777", "lw": 0.9},
        )
        _span(ax, burst[-1], due, f"quiet {quiet:.0f} s", y=RUNS_Y)
        _run(ax, due, length, f"run {names[-1]}", LATER)
        _link(ax, burst[-1], due, PENDING, dashed=True)
    ax.text(
        bursts[0][0] + quiet,
        due_y + 0.1,
        "due time: each call moves it",
        ha="left",
        va="bottom",
        fontsize=8,
        color="#555555",
    )
    _note(
        fig,
        f"| = a call: {len(bursts[0])} calls 100 ms apart, then {len(bursts[1])}. Each moves "
        f"the run to {quiet:.0f} s after itself and replaces its arguments; the run starts "
        f"{quiet:.0f} s\nafter the last call of a burst, with its arguments (the other calls "
        "end skipped). Runs still take the key's lock: they never overlap.",
    )
    return fig


PICTURES: dict[str, Callable[[], Figure]] = {
    "shaping-rate.svg": rate,
    "shaping-cooldown.svg": cooldown,
    "shaping-coalesce.svg": coalesce,
    "shaping-debounce.svg": debounce,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Write every picture (as benchmarks/plot.py writes its charts); return an exit status."""
    sys.path.insert(0, str(OUT.parent.parent / "benchmarks"))
    from plot import write_svgs

    return write_svgs(PICTURES, OUT, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
