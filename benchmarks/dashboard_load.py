"""Dashboard load time for a 10,000-request run, side by side with plotly.js alone, in headless Chromium.

    python -m benchmarks.dashboard_load [--json] [--repeats N]

Page time is navigation start to the last figure drawn, as the page's own probe reports it. The
baseline is a page with the same inlined plotly.js and no figures: the difference is what our figures
cost. Target: the 10,000-request page ready in under 3 s (and under 15 MB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from analysis.dashboard import assemble_dashboard, prepare_runs, write_dashboard
from analysis.dashboard.browser import find_chromium, probe_page
from analysis.dashboard.page import Section, render_page
from analysis.dashboard.synthetic_run import synthetic_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if find_chromium() is None:
        print("needs a Chromium (apt-get install chromium, or .ci/install-chromium)")
        return
    with tempfile.TemporaryDirectory() as directory:
        directory = Path(directory)
        run_dir = synthetic_run(directory / "run", num_requests=10_000, rate=30.0, max_output_tokens=512, name="large")
        page = write_dashboard(assemble_dashboard(prepare_runs([run_dir])), directory / "dashboard.html",
                               browser_probe=True)
        baseline = directory / "baseline.html"
        baseline.write_text(render_page("baseline", "plotly.js alone", [Section("empty", "Empty", ["<p>-</p>"])],
                                        browser_probe=True), encoding="utf-8")
        page_ms, baseline_ms = [], []
        for _ in range(args.repeats):
            page_ms.append(probe_page(page, timeout_s=120).load_ms)
            baseline_ms.append(probe_page(baseline, timeout_s=120).load_ms)
        result = {"page_mb": page.stat().st_size / 1e6, "page_ms_median": statistics.median(page_ms),
                  "baseline_ms_median": statistics.median(baseline_ms)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"10,000-request dashboard: {result['page_mb']:.2f} MB, ready in {result['page_ms_median']:.0f} ms "
          f"(median of {args.repeats}); plotly.js alone {result['baseline_ms_median']:.0f} ms. Target: < 3000 ms.")


if __name__ == "__main__":
    main()
