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

from costs.estimator import (
    EstimateInput,
    checkpoint_interval_seconds,
    expected_spot_cost_at_interval,
    spot_completion_hours,
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


def price_history(series: Sequence[PriceSeries]) -> dict[str, Any]:
    """Spot price over time, one step line per pool."""
    fig = go.Figure(
        [
            go.Scatter(
                x=list(s.at),
                y=list(s.price),
                name=s.label,
                mode="lines+markers",
                line={"shape": "hv"},
            )
            for s in series
        ]
    )
    return _figure(fig, "Spot price history", yaxis_title="USD per instance-hour")


def interruption_rates(labels: Sequence[str], rates: Sequence[float]) -> dict[str, Any]:
    """Preemptions per hour of held spot, one bar per pool."""
    fig = go.Figure([go.Bar(x=list(labels), y=list(rates), marker_color="#c3462b")])
    return _figure(fig, "Interruption rate per pool", yaxis_title="interruptions per hour held")


def cost_against_interval(inp: EstimateInput, points: int = 12) -> dict[str, Any]:
    """Expected spot cost for checkpoint intervals around the recommended (Young/Daly) one."""
    best = checkpoint_interval_seconds(inp)
    intervals = np.unique(np.geomspace(max(best / 8, 30), best * 8, points).round())
    costs = [expected_spot_cost_at_interval(inp, float(s)) for s in intervals]
    fig = go.Figure(
        [
            go.Scatter(x=(intervals / 60).tolist(), y=costs, mode="lines+markers", name="spot"),
            go.Scatter(
                x=[best / 60],
                y=[expected_spot_cost_at_interval(inp, best)],
                mode="markers",
                marker={"size": 12, "symbol": "star"},
                name="recommended",
            ),
        ]
    )
    return _figure(
        fig,
        "Expected spot cost against checkpoint interval",
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
