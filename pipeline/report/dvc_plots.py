"""DVC's plot template ``.dvc/plots/arch_lines.json``, generated from the families' colours (never hand-edited).

``python -m pipeline.report.dvc_plots`` rewrites it; tests/test_figures.py checks the committed file equals
:func:`arch_lines_text`, so a new family's ``PLOT_COLOUR`` reaches DVC's plots like the PNGs.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.report.figures import vega_colour_scale

PATH = Path(".dvc/plots/arch_lines.json")


def arch_lines() -> dict:
    """One line per architecture, coloured as in the PNGs; y fixed to 0-1; a dash per DVC revision. Points with no
    number are dropped first: an arch a profile does not train on a task is an empty column, not a line at 0."""
    scale = vega_colour_scale()
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": "<DVC_METRIC_DATA>"},
        "title": "<DVC_METRIC_TITLE>",
        "width": 420,
        "height": 300,
        "transform": [
            {"filter": "isValid(datum['<DVC_METRIC_Y>']) && datum['<DVC_METRIC_Y>'] !== ''"},
            {"calculate": "isValid(datum.arch) ? datum.arch : replace(datum.field, /^.*\\//, '')", "as": "arch_"},
            {"calculate": "isValid(datum.series) ? datum.series : datum.field", "as": "series_"},
            # each arch's colour as data: the legend lists only the archs with a point (a domain fixed to every
            # arch would list them all), coloured as in the PNGs
            {"calculate": f"{json.dumps(dict(zip(scale['domain'], scale['range'], strict=True)))}[datum.arch_] || "
                          "'#888888'", "as": "colour_"},
        ],
        "mark": {"type": "line", "point": True, "tooltip": {"content": "data"}},
        "encoding": {
            "x": {"field": "<DVC_METRIC_X>", "type": "quantitative", "title": "<DVC_METRIC_X_LABEL>"},
            "y": {"field": "<DVC_METRIC_Y>", "type": "quantitative", "title": "<DVC_METRIC_Y_LABEL>",
                  "scale": {"domain": [0, 1]}},
            "color": {"field": "arch_", "type": "nominal", "title": "architecture", "sort": scale["domain"],
                      "scale": {"range": {"field": "colour_"}}},
            "detail": {"field": "series_"},
            "strokeDash": {"field": "rev", "type": "nominal", "title": "revision"},
        },
    }


def arch_lines_text() -> str:
    return json.dumps(arch_lines(), indent=1) + "\n"


if __name__ == "__main__":
    PATH.write_text(arch_lines_text())
    print(f"wrote {PATH}")
