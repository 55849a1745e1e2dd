"""``gate_summary.html``: the gate's verdict as one static page that renders offline.

Great Expectations' Data Docs (``data_docs/``) load Bootstrap, Font Awesome, jQuery and Vega from
CDNs, so on a machine without network access (an air-gapped cluster, MLflow's artifact viewer)
they render unstyled. This page is written by tidal instead: inline CSS, no script, no link to
anything outside the file; one table row per expectation (source, metric, expected, observed,
pass/fail), the headline, the stats table it read and the validation's real run time (UTC).
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path
from typing import Any

SUMMARY_HTML = "gate_summary.html"
_STYLE = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #bbb;padding:.3em .7em;text-align:left}th{background:#eee}
td.num{text-align:right;font-family:monospace}.pass{color:#176f2c;font-weight:bold}
.fail{color:#b00020;font-weight:bold}pre{background:#f6f6f6;padding:.6em}"""


def render(result: dict[str, Any], run_time: dt.datetime, step_name: str, stats_uri: str) -> str:
    """The page's text for ``result`` (``gate_result.json``: ``success``, ``results``, ``summary``)
    validated at ``run_time`` (timezone-aware) on the stats table at ``stats_uri``."""
    esc = html.escape
    verdict = "pass" if result.get("success") else "fail"
    rows = []
    for r in result.get("results", []):
        ok = "pass" if r["success"] else "fail"
        rows.append(f"<tr><td>{esc(r['source'])}</td><td>{esc(r['column'])}</td><td>{esc(r['expectation'])}</td>"
                    f"<td>{esc(r['expected'])}</td><td class=\"num\">{r['observed']:.6g}</td>"
                    f"<td class=\"{ok}\">{ok.upper()}</td></tr>")
    table = ("<table><tr><th>source</th><th>metric</th><th>expectation</th><th>expected</th><th>observed</th>"
             "<th>result</th></tr>\n" + "\n".join(rows) + "\n</table>") if rows else "<p>No expectation ran.</p>"
    when = run_time.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tidal gate {esc(step_name)}</title>"
            f"<style>{_STYLE}</style></head><body>\n<h1>Gate {esc(step_name)}: "
            f"<span class=\"{verdict}\">{verdict.upper()}</span></h1>\n"
            f"<p>Run time: {when}<br>Stats table: {esc(stats_uri)}</p>\n<pre>{esc(result.get('summary', ''))}</pre>\n"
            f"{table}\n</body></html>\n")


def write_summary_html(out_dir: Path, result: dict[str, Any], run_time: dt.datetime, step_name: str,
                       stats_uri: str) -> Path:
    """Write :func:`render` to ``out_dir/gate_summary.html``; returns its path."""
    path = Path(out_dir) / SUMMARY_HTML
    path.write_text(render(result, run_time, step_name, stats_uri), encoding="utf-8")
    return path
