"""Plotly figures, built as data: each function takes plain values and returns the figure's
JSON (`{"data": [...], "layout": {...}}`) for plotly.js, which the pages load from static.
No Django here; the views gather the values through services.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from costs.estimator import (
    EstimateInput,
    interval_grid_seconds,
    spot_completion_hours,
    spot_cost_curve,
)

LAYOUT: dict[str, Any] = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 340,
    "template": "plotly_white",
    "legend": {"orientation": "h", "y": -0.2},
}


def _figure(fig: go.Figure, title: str, **layout: Any) -> dict[str, Any]:
    fig.update_layout(title=title, **LAYOUT, **layout)
    return fig.to_plotly_json()


@dataclass(frozen=True)
class PriceSeries:
    label: str
    at: Sequence[datetime]
    price: Sequence[float]


# At most this many samples a pool: the history is a snapshot, and the chart says so.
SNAPSHOT_SAMPLES = 2


def price_history(series: Sequence[PriceSeries]) -> dict[str, Any]:
    """Spot price over time: one step line per pool through every recorded sample, dotted on
    from its last sample to the newest sample of any pool (its price held: nothing newer was
    recorded). A history of a snapshot or two says how to record more."""
    ends = [s.at[-1] for s in series if s.at]
    end = max(ends) if ends else None
    colours = qualitative.Plotly
    traces = []
    for n, s in enumerate(series):
        line = {"shape": "hv", "color": colours[n % len(colours)]}
        traces.append(
            go.Scatter(
                x=list(s.at),
                y=list(s.price),
                name=s.label,
                mode="lines+markers",
                line=line,
                legendgroup=s.label,
            )
        )
        if s.at and end is not None and s.at[-1] < end:
            traces.append(
                go.Scatter(
                    x=[s.at[-1], end],
                    y=[s.price[-1]] * 2,
                    mode="lines",
                    line={**line, "dash": "dot"},
                    legendgroup=s.label,
                    showlegend=False,
                    hoverinfo="skip",
                )
            )
    title = "Spot price history"
    snapshot = bool(series) and max(len(s.at) for s in series) <= SNAPSHOT_SAMPLES
    if snapshot:
        title += (
            "<br><sup>A snapshot, not yet a history: record more with import_spot_prices, "
            "or AWS credentials for the hourly refresh</sup>"
        )
    figure = _figure(go.Figure(traces), title, yaxis_title="USD per instance-hour")
    if snapshot:
        figure["layout"]["margin"] = {**figure["layout"]["margin"], "t": 60}
    return figure


def interruption_rates(labels: Sequence[str], rates: Sequence[float]) -> dict[str, Any]:
    """Preemptions per hour of held spot, one bar per pool."""
    fig = go.Figure([go.Bar(x=list(labels), y=list(rates), marker_color="#c3462b")])
    return _figure(fig, "Interruption rate per pool", yaxis_title="interruptions per hour held")


def cost_against_interval(inp: EstimateInput, recommended_s: float) -> dict[str, Any]:
    """Expected spot cost against the checkpoint interval (``spot_cost_curve``, the curve the
    recommendation minimises), with the recommended interval marked on it."""
    intervals = interval_grid_seconds()
    costs = spot_cost_curve(inp, intervals)
    finite = np.isfinite(costs)
    at_best = spot_cost_curve(inp, np.array([recommended_s]))
    fig = go.Figure(
        [
            go.Scatter(
                x=(intervals[finite] / 60).tolist(),
                y=costs[finite].tolist(),
                mode="lines",
                name="expected spot cost",
            ),
            go.Scatter(
                x=[recommended_s / 60],
                y=[float(at_best[0])] if np.isfinite(at_best[0]) else [None],
                mode="markers",
                marker={"size": 12, "symbol": "star"},
                name="recommended (lowest point)",
            ),
        ]
    )
    return _figure(
        fig,
        "Expected spot cost against checkpoint interval (no deadline, exponential spells)",
        xaxis={"title": "minutes between checkpoints", "type": "log"},
        yaxis_title="expected cost (USD)",
    )


def completion_time(inp: EstimateInput) -> dict[str, Any]:
    """Distribution of the completion time on spot, against on-demand's fixed time."""
    spot_hours = spot_completion_hours(inp)
    finite = spot_hours[np.isfinite(spot_hours)]
    on_demand_hours = inp.work_hours + inp.restart_hours
    fig = go.Figure(
        [go.Histogram(x=finite.tolist(), name="spot", opacity=0.75, histnorm="probability")]
    )
    fig.add_vline(x=on_demand_hours, line_dash="dash", annotation_text="on-demand")
    if finite.size:
        fig.add_vline(
            x=float(np.percentile(finite, 90)), line_dash="dot", annotation_text="spot P90"
        )
    return _figure(
        fig,
        "Completion time, spot against on-demand",
        xaxis_title="hours",
        yaxis_title="share of simulated runs",
    )


DECISION_COLOURS = {
    "spot": "#2a9d8f",
    "on_demand": "#e9c46a",
    "waiting": "#bbbbbb",
    "unavailable": "#c3462b",
}


def replay_decisions(replay: dict[str, Any]) -> dict[str, Any]:
    """The what-if replay over time: when spot was away, what the policy and greedy did in
    every stretch (spot, on-demand, waiting) and where they were preempted."""
    rows: dict[str, list[tuple[float, float]]] = {state: [] for state in DECISION_COLOURS}
    labels: dict[str, list[str]] = {state: [] for state in DECISION_COLOURS}
    for start, end in replay["spot_unavailable"]:
        rows["unavailable"].append((start, end))
        labels["unavailable"].append("spot away")
    for plan in ("greedy", "policy"):
        for segment in replay["decisions"][plan]:
            rows[str(segment["state"])].append((segment["start_hours"], segment["end_hours"]))
            labels[str(segment["state"])].append(plan)
    data: list[go.BaseTraceType] = [
        go.Bar(
            x=[end - start for start, end in spans],
            base=[start for start, _ in spans],
            y=labels[state],
            orientation="h",
            name=state.replace("_", "-"),
            marker_color=DECISION_COLOURS[state],
        )
        for state, spans in rows.items()
        if spans
    ]
    for plan in ("greedy", "policy"):
        at = replay["preemptions_at_hours"][plan]
        if at:
            data.append(
                go.Scatter(
                    x=at,
                    y=[plan] * len(at),
                    mode="markers",
                    marker={"symbol": "x", "size": 9, "color": "#222"},
                    name=f"preempted ({plan})",
                )
            )
    fig = go.Figure(data)
    deadline = replay["job"]["deadline_hours"]
    fig.add_vline(x=deadline, line_dash="dash", annotation_text="deadline")
    return _figure(
        fig,
        "Decisions over time",
        barmode="overlay",
        xaxis_title="hours from the window's start",
        yaxis={"categoryorder": "array", "categoryarray": ["spot away", "greedy", "policy"]},
    )
