"""Test vectors for the multi-level cadence from LLNL's SCR-model (Moody et al., SC'10).

    python tests/golden/make_scr_vectors.py /path/to/SCR-model   # a checkout of LLNL/SCR-model

SCR-model is Python 2; this script converts a copy to Python 3 with lib2to3 in a
temporary directory (the checkout is not touched), runs its model for a fixed set of
schedules and for its own machines' interval sweeps, and writes
``tests/golden/scr/vectors.json``. Output is deterministic (fixed seed). The model's code
is not part of ckptbench; only its numbers are kept.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "scr" / "vectors.json"
# SCR-model's driver machines (modelSCR.py): failure rates per severity (1/s) and the
# save = restore cost of each level (s).
MACHINES = {
    "atlas": ([7.78e-6, 5.19e-7], [9.0, 438.0]),
    "coastal": ([8.54e-7, 2.01e-7], [15.0, 1835.0]),
    "made_up": ([7.78e-6, 5.19e-7, 3.0e-8], [9.0, 50.0, 438.0]),
}


def load(checkout: Path, into: Path) -> tuple[Any, Any]:
    for name in ("modelSCR_core.py", "modelSCR.py"):
        shutil.copy(checkout / name, into / name)
    subprocess.run([sys.executable, "-m", "lib2to3", "-w", "-n", "modelSCR_core.py",
                    "modelSCR.py"], cwd=into, check=True, capture_output=True)
    sys.path.insert(0, str(into))
    return importlib.import_module("modelSCR_core"), importlib.import_module("modelSCR")


def efficiency(core: Any, drv: Any, costs: list[float], rates: list[float], t: float,
               counts: list[int]) -> float:
    for memo in (core.XValCache, core.YbaseCache, core.YValCache, core.ZValCache):
        memo.clear()  # keyed by values that do not name every input
    top = len(costs)
    with contextlib.redirect_stdout(io.StringIO()):  # its caches print on every hit
        opts = drv.setupRun(top, top, top, [0, *counts, 1], t, [0, *costs], [0, *costs],
                            [0, *rates], sum(rates), False, 1e-6)
        return float(drv.computeMetrics(core.X(top, top, opts), opts)["efficiency"])


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    checkout = Path(sys.argv[1])
    rng = random.Random(20261203)
    with tempfile.TemporaryDirectory() as tmp:
        core, drv = load(checkout, Path(tmp))
        schedules = []
        for _ in range(240):
            levels = rng.choice([2, 3, 4])
            costs = sorted(round(rng.uniform(1, 2000), 3) for _ in range(levels))
            rates = [float(f"{10 ** rng.uniform(-8, -4.5):.4g}") for _ in range(levels)]
            t = round(rng.uniform(10, 10000), 3)
            counts = [rng.randint(0, 12) for _ in range(levels - 1)]
            schedules.append({"save_s": costs, "restore_s": costs, "rates": rates,
                              "compute_s": t, "counts": counts,
                              "efficiency": efficiency(core, drv, costs, rates, t, counts)})
        sweeps = []
        for name, (rates, costs) in MACHINES.items():
            best: dict[str, Any] = {"efficiency": -1.0}
            upper = 12 if len(costs) == 3 else 48
            for v1 in range(1, upper + 1):
                for v2 in (range(1, 41) if len(costs) == 3 else [None]):
                    counts = [v1] if v2 is None else [v1, v2]
                    for t in range(20, 8001, 20):
                        e = efficiency(core, drv, costs, rates, float(t), counts)
                        if e > best["efficiency"]:
                            best = {"efficiency": e, "compute_s": float(t), "counts": counts}
            sweeps.append({"machine": name, "save_s": costs, "restore_s": costs,
                           "rates": rates, "t_grid": [20, 8000, 20], **best})
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({
        "source": "LLNL/SCR-model (modelSCR_core.py, modelSCR.py), converted by lib2to3",
        "schedules": schedules, "grid_optima": sweeps}, indent=1) + "\n")
    print(f"wrote {OUT}: {len(schedules)} schedules, {len(sweeps)} grid optima")


if __name__ == "__main__":
    main()
