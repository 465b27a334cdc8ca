"""Assemble the dashboard into one self-contained HTML file.

Self-contained means it opens offline, from a mail attachment or a CI artifact: plotly.js is inlined
once in <head> (not once per figure), the stylesheet is inline, and no tag loads anything from a URL.
Each figure is a div and a short script calling Plotly.newPlot with the figure's JSON, which plotly
encodes compactly (numeric arrays as base64 typed arrays).

With `browser_probe=True` (tests only) two small scripts are added: one before plotly.js that records
every JavaScript error, and one at the end that counts the rendered figures and writes
"DASHBOARD-PROBE rendered=<n> expected=<m> errors=<k> load_ms=<t>" into the document title, where a
headless browser's --dump-dom can read it.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import plotly.io as plotly_io
import plotly.offline

from analysis.dashboard.figure_style import DashboardFigure

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "toImageButtonOptions": {"format": "png", "scale": 2}}
PROBE_TITLE_PREFIX = "DASHBOARD-PROBE"


@dataclass
class Section:
    """A titled part of the page: HTML snippets and figures, in order."""

    section_id: str
    title: str
    items: list[str | DashboardFigure] = field(default_factory=list)

    @property
    def figures(self) -> list[DashboardFigure]:
        return [item for item in self.items if isinstance(item, DashboardFigure)]


STYLESHEET = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif; margin: 0;
       color: #1f2937; background: #f3f4f6; }
header { background: #111827; color: #f9fafb; padding: 16px 28px; position: sticky; top: 0; z-index: 10; }
header h1 { margin: 0 0 4px 0; font-size: 22px; }
header p { margin: 0 0 8px 0; color: #d1d5db; font-size: 13px; }
nav a { color: #93c5fd; margin-right: 14px; font-size: 13px; text-decoration: none; }
main { padding: 12px 28px 40px 28px; max-width: 1500px; margin: 0 auto; }
section { background: #fff; border-radius: 8px; padding: 8px 20px 16px 20px; margin: 18px 0;
          box-shadow: 0 1px 2px rgba(0,0,0,.06); scroll-margin-top: 96px; }
section h2 { font-size: 19px; margin: 12px 0 8px 0; }
figure { margin: 8px 0 20px 0; }
figcaption { color: #4b5563; font-size: 13px; margin: 2px 0 0 4px; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 6px;
          vertical-align: -1px; }
ul.runs { list-style: none; padding: 0; margin: 6px 0; font-size: 14px; }
ul.runs li { margin: 3px 0; }
.mode { background: #e5e7eb; border-radius: 4px; padding: 0 5px; font-size: 12px; }
table.metrics { border-collapse: collapse; font-size: 13px; margin: 8px 0 14px 0; }
table.metrics caption { text-align: left; color: #4b5563; padding: 4px 0; }
table.metrics th, table.metrics td { border-bottom: 1px solid #e5e7eb; padding: 3px 12px; text-align: right;
                                     white-space: nowrap; }
table.metrics th:first-child { text-align: left; font-weight: 600; }
table.metrics thead th { background: #f9fafb; }
.delta { color: #6b7280; font-size: 12px; }
.delta.better { color: #15803d; }
.delta.worse { color: #b91c1c; }
pre.config { background: #f9fafb; padding: 10px; font-size: 12px; max-height: 480px; overflow: auto; }
details { margin: 6px 0; }
div.tables { display: flex; flex-wrap: wrap; gap: 8px 48px; align-items: flex-start; }
p.note { color: #4b5563; font-size: 13px; margin: 6px 0; }
"""

PROBE_HEAD_SCRIPT = """
window.dashboardErrors = [];
window.addEventListener('error', function (event) { window.dashboardErrors.push(String(event.message)); });
window.addEventListener('unhandledrejection', function (event) {
  window.dashboardErrors.push('unhandled rejection: ' + String(event.reason));
});
"""

PROBE_TAIL_SCRIPT = """
(function () {
  var expected = %d;
  var started = Date.now();
  function rendered() {
    return Array.prototype.filter.call(document.querySelectorAll('.js-plotly-plot'),
      function (div) { return div.querySelector('.main-svg') !== null; }).length;
  }
  function report() {
    var count = rendered();
    document.title = '%s rendered=' + count + ' expected=' + expected + ' errors=' +
      window.dashboardErrors.length + ' load_ms=' + Math.round(performance.now());
    document.getElementById('dashboard-probe-errors').textContent = window.dashboardErrors.join('\\n');
    // Plotly draws synchronously for these figure types; poll briefly in case a browser defers it.
    if (count < expected && Date.now() - started < 10000) { setTimeout(report, 50); }
  }
  report();
})();
"""


def figure_html(item: DashboardFigure) -> str:
    """A figure's div and the script that draws it."""
    spec = plotly_io.to_json(item.figure, validate=False)
    # A "</script>" inside a string (a run named so) must not end the script element early.
    spec = spec.replace("</", "<\\/")
    height = item.figure.layout.height or 450
    div_id = html.escape(item.figure_id, quote=True)
    caption = f"<figcaption>{html.escape(item.note)}</figcaption>" if item.note else ""
    return (
        f'<figure id="{div_id}-block"><div id="{div_id}" class="dashboard-figure" style="height:{height}px;'
        f'width:100%"></div>{caption}<script>(function () {{ var spec = {spec}; '
        f"Plotly.newPlot({json.dumps(item.figure_id)}, spec.data, spec.layout, {json.dumps(PLOTLY_CONFIG)}); "
        "})();</script></figure>"
    )


def render_page(title: str, subtitle: str, sections: Sequence[Section], browser_probe: bool = False) -> str:
    figure_ids = [figure.figure_id for section in sections for figure in section.figures]
    if len(set(figure_ids)) != len(figure_ids):
        raise ValueError(f"figure ids must be unique, got {figure_ids}")
    navigation = "".join(f'<a href="#{html.escape(section.section_id)}">{html.escape(section.title)}</a>'
                         for section in sections)
    body = []
    for section in sections:
        parts = [figure_html(item) if isinstance(item, DashboardFigure) else item for item in section.items]
        body.append(f'<section id="{html.escape(section.section_id)}"><h2>{html.escape(section.title)}</h2>'
                    f"{''.join(parts)}</section>")
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    probe_head = f"<script>{PROBE_HEAD_SCRIPT}</script>" if browser_probe else ""
    probe_tail = ('<pre id="dashboard-probe-errors"></pre>'
                  f"<script>{PROBE_TAIL_SCRIPT % (len(figure_ids), PROBE_TITLE_PREFIX)}</script>"
                  if browser_probe else "")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLESHEET}</style>{probe_head}"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<header><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)} &middot; generated {generated}</p>"
        f"<nav>{navigation}</nav></header><main>{''.join(body)}</main>{probe_tail}</body></html>\n"
    )


PLOTLY_BANNER = re.compile(r"\* plotly\.js v\d+\.\d+\.\d+")
TAG_PATTERN = re.compile(r"<(script|link|img|iframe|embed|object|source)\b([^>]*)>", re.IGNORECASE)
URL_ATTRIBUTE = re.compile(r"\b(src|href|data)\s*=\s*[\"']?\s*(https?:|//)", re.IGNORECASE)


def self_containment_problems(page: str) -> list[str]:
    """Why `page` would not open offline (empty when it would): external scripts, stylesheets or any
    tag loading from a URL, and plotly.js missing or inlined more than once."""
    problems = []
    for match in TAG_PATTERN.finditer(page):
        tag, attributes = match.group(1).lower(), match.group(2)
        if tag == "script" and re.search(r"\bsrc\s*=", attributes, re.IGNORECASE):
            problems.append(f"external script: {match.group(0)[:200]}")
        elif tag == "link" and re.search(r"stylesheet", attributes, re.IGNORECASE):
            problems.append(f"external stylesheet: {match.group(0)[:200]}")
        elif URL_ATTRIBUTE.search(attributes):
            problems.append(f"tag loading a URL: {match.group(0)[:200]}")
    banners = len(PLOTLY_BANNER.findall(page))
    if banners != 1:
        problems.append(f"plotly.js must be inlined exactly once, found {banners} copies")
    return problems
