"""benchmarks/scaling_model.py (docs/SCALING.md): its terms add up, follow the plan's bytes
and reproduce the figure it was calibrated on."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from embtrain.bench.synthetic import load_model

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling_model.py"


@pytest.fixture(scope="module")
def sm():
    spec = importlib.util.spec_from_file_location("scaling_model", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scaling_model"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_terms_add_up_and_name_the_largest(sm):
    for key in ("gpu", "cpu"):
        for n in (8, 64):
            p = sm.model_point(load_model("tiny"), sm.CLUSTERS[key], n)
            t = p["terms_ms"]
            assert all(v > 0 for v in t.values())
            assert p["step_ms"] == pytest.approx(sum(t.values()))
            assert p["overlapped_ms"] <= p["step_ms"]
            assert p["bound_by"] == max(t, key=t.get)


def test_one_gpu_reproduces_the_published_step_it_was_calibrated_on(sm):
    p = sm.model_point(load_model("tiny"), sm.CLUSTERS["gpu"], 1)
    assert p["terms_ms"]["exchange"] == 0 and p["terms_ms"]["allreduce"] == 0
    assert p["owner_lookups"] == sm.TINY_LOOKUPS
    assert p["step_ms"] == pytest.approx(24.433, rel=1e-9)


def test_exchange_grows_with_the_plans_bytes_and_shrinks_with_bandwidth(sm):
    gpu = sm.CLUSTERS["gpu"]
    tiny = sm.model_point(load_model("tiny"), gpu, 64)
    small = sm.model_point(load_model("small"), gpu, 64)
    assert small["exchange_bytes"] > tiny["exchange_bytes"]
    assert small["terms_ms"]["exchange"] > tiny["terms_ms"]["exchange"]
    slow = replace(gpu, inter_bw=gpu.inter_bw / 10)
    slower = sm.model_point(load_model("small"), slow, 64)
    assert slower["terms_ms"]["exchange"] > small["terms_ms"]["exchange"]
    assert slower["terms_ms"]["embedding"] == small["terms_ms"]["embedding"]
