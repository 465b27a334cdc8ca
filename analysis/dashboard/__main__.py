"""Build a dashboard: ``python -m analysis.dashboard RUN_DIR [RUN_DIR ...] -o report.html``.

One run gives its dashboard; several runs are overlaid (one colour per run) with a table of
differences from the first; a sweep directory (holding sweep.csv) or runs differing in one setting
add the latency-throughput curve; a real run beside its simulation adds the fidelity figures.
The page is a single HTML file with everything inlined: it opens offline in any browser.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.dashboard.build import assemble_dashboard, prepare_runs, write_dashboard


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m analysis.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="run directories (requests.parquet, steps.parquet, summary.json) or sweep directories")
    parser.add_argument("-o", "--out", type=Path, default=Path("dashboard.html"),
                        help="the HTML file to write (default: dashboard.html)")
    parser.add_argument("--title", help="page title (default: from the runs)")
    parser.add_argument("--png-dir", type=Path, help="also write each figure as PNG here (needs kaleido)")
    args = parser.parse_args(argv)
    if args.out.is_dir():
        parser.error(f"-o/--out: {str(args.out)!r} is a directory; give the page to write, e.g. "
                     f"{str(args.out / 'dashboard.html')!r}")
    if args.png_dir is not None and args.png_dir.exists() and not args.png_dir.is_dir():
        parser.error(f"--png-dir: {str(args.png_dir)!r} is a file, not a directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    try:
        print(f"loading {len(args.run_dirs)} input(s) ...", file=sys.stderr)
        runs = prepare_runs(args.run_dirs)
        print(f"building figures for {len(runs)} run(s) ...", file=sys.stderr)
        dashboard = assemble_dashboard(runs, args.title)
        path = write_dashboard(dashboard, args.out, png_dir=args.png_dir)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    size_mb = path.stat().st_size / 1e6
    sections = ", ".join(section.section_id for section in dashboard.sections)
    print(f"wrote {path} ({size_mb:.1f} MB, {len(dashboard.figures)} figures, {len(runs)} run(s); "
          f"sections: {sections}) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
