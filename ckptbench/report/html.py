"""The report as one self-contained HTML file: the summary tables, each run's figures as
PNG data URIs, and what each run was (options, target, machine).

No script and no external resource of any kind: the page opens from a mail attachment
or an air-gapped cluster, and its Content-Security-Policy forbids the browser to load
anything but the images inside it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from html import escape
from typing import Any

from ckptbench import __version__
from ckptbench.report import compare
from ckptbench.report.data import RunData
from ckptbench.report.figures import Drawn, Picture
from ckptbench.report.table import (
    Grid,
    async_grid,
    parts_grid,
    restore_plan_grid,
    split,
    storage_grid,
    summary_grid,
)
from ckptbench.units import format_size

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1180px;
       padding: 0 1em; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
.fit { max-width: 100%; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; white-space: nowrap; }
table { border-collapse: collapse; margin: 0.8em 0; font-variant-numeric: tabular-nums;
        font-size: 13px; max-width: 100%; }
td.text { overflow-wrap: anywhere; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #e3e3e3; vertical-align: top; }
th { background: #f4f4f4; text-align: left; font-weight: 600; }
th small { display: block; font-weight: normal; color: #666; }
td.num, th.num { text-align: right; white-space: nowrap; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; box-sizing: border-box; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.92em; max-width: 70em; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.15em 1em; }
dt { color: #555; } dd { margin: 0; overflow-wrap: anywhere; }
.note { color: #444; font-size: 0.92em; margin: 0.2em 0; }
.error { color: #a40000; font-weight: 600; }
pre { background: #f7f7f7; padding: 0.8em; white-space: pre-wrap; overflow-wrap: anywhere;
      font-size: 12px; }
"""


PAGE_CHARS = 150  # a table part's width in characters (5.5 px each at 13 px): 830 px and some


def grid_html(grid: Grid) -> str:
    """A :class:`Grid` as HTML tables that fit the page: split into parts as the terminal
    does (each repeating the columns that name a row), text wrapping, numbers whole;
    notes under the last part."""
    parts = split(grid, PAGE_CHARS)
    out = []
    for n, part in enumerate(parts, 1):
        cols = [grid.columns[i] for i, _ in part]
        head = "".join(
            f'<th class="{"num" if c.numeric else "text"}">'
            f'{"<br>".join(escape(line) for line in c.name.splitlines())}'
            f'{f"<small>{escape(c.stat)}</small>" if c.stat else ""}</th>' for c in cols)
        body = "".join(
            "<tr>" + "".join(f'<td class="{"num" if c.numeric else "text"}">{escape(row[i])}</td>'
                             for c, (i, _) in zip(cols, part, strict=True)) + "</tr>"
            for row in grid.rows)
        title = grid.title if len(parts) == 1 else f"{grid.title} ({n} of {len(parts)})"
        out.append(f'<div class="fit"><table><caption>{escape(title)}</caption>'
                   f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
    notes = "".join(f'<p class="{"error" if n.startswith("FAILED") else "note"}">{escape(n)}</p>'
                    for n in grid.notes)
    return "".join(out) + notes


def figure_html(p: Picture) -> str:
    data = base64.b64encode(p.png).decode("ascii")
    return (f'<figure id="{escape(p.name)}"><img alt="{escape(p.title)}" '
            f'src="data:image/png;base64,{data}"><figcaption><b>{escape(p.title)}.</b> '
            f"{escape(p.caption)}</figcaption></figure>")


def _facts(run: RunData) -> list[tuple[str, str]]:
    """What the run was: file, workload, ranks, target, machine (never credentials: the
    run record is redacted when written)."""
    r = run.view["run"]
    env = r.get("environment", {})
    target = env.get("target", {})
    plan = r.get("plan", {})
    ranks = r.get("ranks", [])
    facts = [
        ("results file", run.path),
        ("run id", str(r.get("run_id", "?"))),
        ("started (UTC)", str(env.get("started_utc", "?"))),
        ("workload", f"{run.name}: {r.get('workload', {}).get('description', '')}".rstrip(": ")),
        ("ranks run", f"{len(ranks)} of {plan.get('world_size', '?')}, scale 1/{r.get('scale', 1)}"),
        ("bytes per checkpoint", format_size(r.get("bytes_per_iteration", 0))),
        ("target", f"{target.get('backend', '?')}: {target.get('target', '?')}"),
        ("file system", " ".join(str(target[k]) for k in ("fs_type", "mount_point", "device",
                                                          "mount_options") if target.get(k))),
        ("machine", f"{env.get('host', '?')}: {env.get('cpu', '?')}, {env.get('cpus', '?')} CPUs, "
                    f"{format_size(env.get('memory_bytes', 0))}, kernel {env.get('kernel', '?')}"),
        ("options", compare.describe(compare.facets(r))),
    ]
    return [(k, v) for k, v in facts if v]


def run_section(run: RunData, pictures: Sequence[Picture], heading: str) -> str:
    facts = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in _facts(run))
    errors = "".join(f'<p class="error">FAILED {escape(e["phase"])} iteration {e["iteration"]}: '
                     f'{escape(e["message"])}</p>' for e in run.view["errors"])
    figures = "".join(figure_html(p) for p in pictures) or \
        '<p class="note">no op records: nothing to draw</p>'
    record = escape(json.dumps(run.view["run"], indent=2, sort_keys=True))
    return (f"<section><h2>{escape(heading)}</h2><dl>{facts}</dl>{errors}{figures}"
            f"<details><summary>run record</summary><pre>{record}</pre></details></section>")


def render_html(drawn: Drawn, job: Grid | None = None,
                tiers: tuple[Sequence[Grid], Sequence[Picture]] = ((), ())) -> str:
    """The whole page; `job`: what the job will see (cadence.job), after the summary;
    `tiers`: the recovery tiers' tables and the multi-level cadence's figures."""
    runs = drawn.runs
    views: list[dict[str, Any]] = [r.view for r in runs]
    tables = grid_html(summary_grid(views))
    for extra in (restore_plan_grid(views), parts_grid(views), storage_grid(views),
                  async_grid(views)):
        if extra is not None:
            tables += grid_html(extra)
    several = len(runs) > 1
    parts = [f"<h2>Summary</h2>{tables}"]
    if job is not None:
        parts.append(f"<h2>What the job will see</h2>{grid_html(job)}")
    if tiers[0] or tiers[1]:
        parts.append("<h2>Recovery tiers</h2>" + "".join(grid_html(g) for g in tiers[0])
                     + "".join(figure_html(p) for p in tiers[1]))
    if drawn.compare is not None:
        parts.append(f"<h2>Comparison</h2>{figure_html(drawn.compare)}")
    parts += [run_section(r, pics, f"#{i} {r.label}" if several else f"Run: {r.label}")
              for i, (r, pics) in enumerate(zip(runs, drawn.per_run, strict=True), 1)]
    title = "ckptbench report: " + ", ".join(dict.fromkeys(r.name for r in runs))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{STYLE}</style></head>
<body><h1>{escape(title)}</h1>
<p class="note">{len(runs)} results file(s); generated {time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())}
by ckptbench {escape(__version__)}.</p>
{"".join(parts)}
</body></html>
"""
