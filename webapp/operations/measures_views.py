"""The staff dashboard of call measures: turn-taking and echo per persona, voice, checkpoint or engine
(``?by=``), a table and charts over days (``webapp.operations.call_measures``, ``svg_chart``)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.safestring import mark_safe

from webapp.operations.call_measures import DIMENSIONS, aggregate, measured_calls, series
from webapp.operations.svg_chart import line_chart

CHARTS = (
    ("latency_s", "Mean response latency (caller stops → agent starts)", "s"),
    ("overlaps_per_min", "Overlaps per minute", "/min"),
    ("echo_share", "Share of calls where the agent could hear itself", ""),
)


@login_required
def measures_page(request: HttpRequest) -> HttpResponse:
    if not (request.user.is_active and request.user.is_staff):
        return HttpResponse("Staff only.", status=403, content_type="text/plain")
    dimension = request.GET.get("by", "engine")
    if dimension not in DIMENSIONS:
        dimension = "engine"
    rows, daily = aggregate(measured_calls(), dimension)
    # Built from numbers and escaped names only (svg_chart escapes every text it writes).
    charts = [
        mark_safe(line_chart(title, series(daily, metric), unit=unit, chart_id=f"chart-{metric}"))  # noqa: S308
        for metric, title, unit in CHARTS
    ]
    context = {"rows": rows, "charts": charts, "dimension": dimension, "dimensions": DIMENSIONS.items()}
    return render(request, "operations/measures.html", context)
