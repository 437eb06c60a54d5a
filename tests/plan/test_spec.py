"""Workload validation: every bad input names its key and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.errors import SpecError
from ckptbench.fields import parse_ranks
from ckptbench.spec import load_workload, parse_workload, scaled

CUSTOM = {
    "model": {"name": "custom", "layers": 2, "dim": 256, "heads": 8, "kv_heads": 4,
              "ffn_dim": 688, "vocab_size": 1000},
    "state": {"param_dtype": "float32", "optimizer": "adamw", "optimizer_dtype": "float32"},
    "parallel": {"world_size": 4, "layout": "fsdp2", "tp": 2, "pp": 1, "dp_replicate": 1},
}


def with_(section: str, **kv):
    data = {k: dict(v) for k, v in CUSTOM.items()}
    data.setdefault(section, {}).update(kv)
    return data


def test_custom_model_in_the_documented_form():
    w = parse_workload(CUSTOM)
    assert w.model.dim == 256 and w.parallel.dp_shard == 2 and w.parallel.tp == 2


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (with_("model", colour=1), "[model] unknown key 'colour'"),
        (with_("model", name="gpt-5"), "[model] name = 'gpt-5' is not a known model; allowed:"),
        (with_("parallel", layout="zero++"), "[parallel] layout = 'zero++' is not allowed; allowed: fsdp2"),
        (with_("parallel", tp=3, world_size=6), "tp = 3 must divide [model] heads = 8"),
        (with_("parallel", tp=8, world_size=8), "tp = 8 must divide [model] kv_heads = 4"),
        (with_("parallel", world_size=5), "world_size = 5 must be divisible by tp x pp x dp_replicate"),
        (with_("parallel", pp=4, world_size=8, tp=1), "pp = 4 stages is more than [model] layers = 2"),
        (with_("model", dim=0), "[model] dim = 0 must be an integer >= 1"),
        (with_("model", layers=-2), "[model] layers = -2 must be an integer >= 1"),
        (with_("parallel", world_size=0), "world_size = 0 must be an integer >= 1"),
        (with_("state", param_dtype="float8"), "[state] param_dtype = 'float8' is not allowed"),
        (with_("checkpoint", files="tar"), "[checkpoint] files = 'tar' is not allowed"),
        ({**CUSTOM, "extra": {}}, "unknown table [extra]"),
    ],
)
def test_bad_input_names_the_key(data, needle):
    with pytest.raises(SpecError) as err:
        parse_workload(data)
    message = str(err.value)
    assert needle in message
    assert "\n" not in message


def test_custom_model_requires_its_dimensions():
    data = with_("model")
    del data["model"]["ffn_dim"]
    with pytest.raises(SpecError, match=r"\[model\] ffn_dim is required"):
        parse_workload(data)


def test_every_shipped_workload_loads():
    root = Path(__file__).resolve().parents[2] / "workloads"
    files = sorted(root.glob("*.toml"))
    assert len(files) >= 10
    for f in files:
        load_workload(f)


def test_parse_ranks():
    assert parse_ranks("0-3,8", 16) == [0, 1, 2, 3, 8]
    assert parse_ranks("0,3", 4) == [0, 3]
    with pytest.raises(SpecError, match="outside 0-3"):
        parse_ranks("2-5", 4)
    with pytest.raises(SpecError, match="not a rank or range"):
        parse_ranks("a", 4)


def test_scale_keeps_the_layout_and_shrinks_tensors():
    w = parse_workload(with_("model"))
    s = scaled(w, 4)
    assert s.parallel == w.parallel and s.model.layers == w.model.layers
    assert s.model.dim == w.model.dim // 4 and s.model.heads == w.model.heads
    assert s.model.ffn_dim == w.model.ffn_dim // 4


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[model]\nname = "custom"\nlayers = 2\ndim = 64\nheads = 4\nkv_heads = 2\nffn_dim = 8\n'
         'vocab_size = 10\nwat = 1\n', "unknown key 'wat'"),
        ('[model]\nname = "llama3-8b"\n[parallel]\nworld_size = 6\ntp = 3\n', "tp = 3"),
        ('[model]\nname = "llama3-8b"\n[parallel]\nlayout = "ddp"\n', "layout = 'ddp'"),
        ("[model\n", "not valid TOML"),
    ],
)
def test_cli_bad_workload_is_one_line_exit_2(tmp_path, toml, needle):
    f = tmp_path / "w.toml"
    f.write_text(toml)
    r = _cli("plan", str(f))
    assert r.returncode == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr
