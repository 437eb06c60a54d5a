"""Records -> answers, and the answers shown: statistics (``summary``; ``asynchronous``
for --mode async runs: blocking, persist, interference), the one throughput every
command prints and the names of the other rates (``throughput``), the terminal table
(``table``), the runs' differing options (``compare``), figures (``figures``, matplotlib)
and the self-contained HTML report (``html``).

The statistics are what other steps import (``measure`` summarizes a run with them); the
figures and the HTML page are imported by whoever renders them, so a run never pays for
matplotlib.
"""

from ckptbench.report.asynchronous import summarize_async
from ckptbench.report.summary import (
    LATENCY_OPS,
    iteration_stats,
    load,
    stored_stats,
    stored_summary,
    summarize,
    view,
)

__all__ = ["LATENCY_OPS", "iteration_stats", "load", "stored_stats", "stored_summary",
           "summarize", "summarize_async", "view"]
