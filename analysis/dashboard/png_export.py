"""Optional PNG export of every dashboard figure, through plotly's kaleido (not a required dependency).

kaleido drives a Chrome or Chromium to rasterise figures; when kaleido or a browser is missing the
export is skipped with one clear message, never an exception: the HTML dashboard is the product,
PNGs are extra. All figures go through one `write_images` call, so the browser starts once.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import plotly.io as plotly_io

from analysis.dashboard.figure_style import FIGURE_HEIGHT, DashboardFigure

PNG_WIDTH = 1400


def kaleido_available() -> bool:
    return importlib.util.find_spec("kaleido") is not None


def export_pngs(figures: Sequence[DashboardFigure], png_dir: Path) -> list[Path]:
    """Write `<png_dir>/<figure_id>.png` for each figure; return the files written (none if skipped)."""
    if not kaleido_available():
        print("PNG export skipped: kaleido is not installed (pip install kaleido; it also needs Chrome or "
              "Chromium).", file=sys.stderr)
        return []
    png_dir.mkdir(parents=True, exist_ok=True)
    paths = [png_dir / f"{item.figure_id}.png" for item in figures]
    try:
        plotly_io.write_images([item.figure for item in figures], paths, format="png", width=PNG_WIDTH,
                               height=[item.figure.layout.height or FIGURE_HEIGHT for item in figures])
    except Exception as error:  # kaleido raises its own error types, e.g. when no browser can start
        print(f"PNG export skipped: kaleido could not render the figures ({type(error).__name__}: {error}).",
              file=sys.stderr)
        return [path for path in paths if path.is_file()]
    print(f"wrote {len(paths)} PNG files to {png_dir}/", file=sys.stderr)
    return paths
