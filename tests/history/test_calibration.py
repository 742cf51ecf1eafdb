"""The model's error on measured runs: configurations from saved records, leave-one-out and the
fabric penalty predicted from the fast fabric alone, on synthetic runs whose answers are known.

fixtures/calibration/synthetic-night.json is a --fabric-save file whose step times the model itself
generated: 2e10 FLOP/s per rank, 50 ms multi-node overhead, link efficiency 0.9, qwen2-tiny and
llama-wide on 1 node and on 2 nodes over ib (2000 Mbit/s) and eth (400), fp32, two identical
launches each, over gloo (whose reduce-scatter moves an all-reduce's bytes: ``step_model.RING_BYTES``).
"""

from __future__ import annotations

import copy
import math
import random
import statistics

import pytest
from helpers import REPO

from pytest_fabric.history.calibration import (EFFICIENCY_GRID, Configuration, configurations,
                                               study, study_lines)
from pytest_fabric.core.models import get_model
from pytest_fabric.physics.step_model import JobShape, Observation, predict_step
from pytest_fabric.history.night_model import ResultsError
from pytest_fabric.history.night_files import load_records

FIXTURE = REPO / "fixtures" / "calibration" / "synthetic-night.json"
FLOPS, OVERHEAD, EFFICIENCY = 2e10, 0.05, 0.9


def synthetic(flops=FLOPS, overhead=OVERHEAD, efficiency=EFFICIENCY, noise=0.0, seed=0, rates=(("ib", 2.0),
              ("eth", 0.4)), models=("qwen2-tiny", "llama-wide"), nodes=(1, 2, 4)) -> list[Configuration]:
    rng = random.Random(seed)
    out = []
    for model in models:
        spec = get_model(model)
        for n in nodes:
            for fabric, gbit in (rates if n > 1 else [("any", None)]):
                step = predict_step(JobShape(spec, n, dtype="fp32"), flops_per_s=flops, inter_gbit=gbit, overhead_s=overhead,
                                    link_efficiency=efficiency).step_s * (1 + rng.gauss(0, noise))
                out.append(Configuration(fabric, Observation(JobShape(spec, n, dtype="fp32"), step, inter_gbit=gbit), 3))
    return out


class TestConfigurations:
    def test_from_a_saved_night(self):
        configs, notes = configurations(load_records(FIXTURE))
        assert notes == []
        assert [c.label for c in configs] == ["llama-wide n1x1 any", "llama-wide n2x1 ib", "llama-wide n2x1 eth",
                                              "qwen2-tiny n1x1 any", "qwen2-tiny n2x1 ib", "qwen2-tiny n2x1 eth"]
        assert all(c.launches == 2 for c in configs)
        eth = configs[2].observation
        assert eth.inter_gbit == 0.4 and eth.shape.bytes == (4, 4)
        assert eth.shape.backend == "gloo"  # as recorded: its reduce-scatter moves an all-reduce's bytes
        assert eth.step_s == pytest.approx(predict_step(JobShape(get_model("llama-wide"), 2, dtype="fp32", backend="gloo"),
                                                        flops_per_s=FLOPS, inter_gbit=0.4, overhead_s=OVERHEAD).step_s)

    def test_rates_off_the_emulated_cluster(self):
        records = copy.deepcopy(load_records(FIXTURE))
        for r in records.values():
            r["cluster"] = "slurm"
        configs, _ = configurations(records)
        assert {c.fabric: c.observation.inter_gbit for c in configs if c.fabric != "any"} == {"ib": 3200, "eth": 100}
        configs, _ = configurations(records, {"eth": 25})
        assert {c.observation.inter_gbit for c in configs if c.fabric == "eth"} == {25}
        for r in records.values():
            r["case"]["fabric"] = r["result"]["fabric"]["name"] = "mine" if r["case"]["fabric"] == "eth" else "ib"
        configs, notes = configurations(records)
        assert "mine" not in {c.fabric for c in configs}
        assert any("no link rate known for fabric 'mine' (give --gbit mine=GBIT)" in n for n in notes)

    def test_unknown_models_and_failed_launches_are_left_out(self):
        records = copy.deepcopy(load_records(FIXTURE))
        records["x#1"] = {"case": {"model": "gpt-9", "nodes": 2, "fabric": "ib"}, "cluster": "emulated",
                          "result": {"step_s": [1.0]}}
        records["y#1"] = {"case": {"model": "llama-wide", "nodes": 2, "fabric": "ib"}, "error": "rank 0 exited 1"}
        configs, notes = configurations(records)
        assert len(configs) == 6 and notes == ["x#1: model 'gpt-9' is not in the catalog; left out"]

    def test_launches_combine_by_their_geometric_mean(self):
        """Two launches of one configuration at different speeds: its step time is the geometric
        mean of the launches' step times (the same value as tokens/s: the geometric mean of
        tokens/s is tokens_per_step over it), not the median of the two."""
        records = copy.deepcopy(load_records(FIXTURE))
        first, second = records["qwen2-tiny-n2-ib#synthetic"], records["qwen2-tiny-n2-ib#synthetic@1"]
        for record, step in ((first, 0.2), (second, 0.8)):
            record["result"]["step_s"] = [step] * 6
            record["result"]["signals"] = {name: [] if isinstance(v, list) else v for name, v in record["result"]["signals"].items()}  # none recorded
        configs, notes = configurations(records)
        assert notes == []
        ib = next(c for c in configs if c.label == "qwen2-tiny n2x1 ib")
        assert ib.launches == 2
        assert ib.observation.step_s == pytest.approx(math.sqrt(0.2 * 0.8), rel=1e-12)  # 0.4, not 0.5
        assert ib.observation.step_s != pytest.approx(statistics.median([0.2, 0.8]))

    def test_disturbed_steps_are_set_aside_as_the_gates_do(self):
        """Steps the node's signals marked disturbed do not count in a launch's value: the median of
        the clean steps (0.1 s), not of every step (0.3 s)."""
        records = copy.deepcopy(load_records(FIXTURE))
        for key in ("qwen2-tiny-n2-eth#synthetic", "qwen2-tiny-n2-eth#synthetic@1"):
            r = records[key]["result"]
            r["step_s"] = [0.1, 0.1, 0.5, 0.5, 0.5, 0.5, 0.1, 0.1]
            r["signals"] = {name: [] if isinstance(v, list) else v for name, v in r["signals"].items()}
            r["signals"]["disturbed"] = ["", "", "cpu steal 40 ms", "cpu steal 40 ms", "cpu steal 41 ms",
                                         "cpu slowed 35%", "", ""]
            assert statistics.median(r["step_s"]) == pytest.approx(0.3)
        configs, notes = configurations(records)
        assert notes == []
        eth = next(c for c in configs if c.label == "qwen2-tiny n2x1 eth")
        assert eth.observation.step_s == pytest.approx(0.1)

    def test_only_files_with_step_times(self, tmp_path):
        junit = tmp_path / "j.xml"
        junit.write_text("<testsuite/>")
        with pytest.raises(ResultsError, match="holds no launch records"):
            load_records(junit)


class TestStudy:
    def test_exact_runs_give_the_generating_constants_and_no_error(self):
        s = study(synthetic())
        assert s.fit.flops_per_s == pytest.approx(FLOPS, rel=1e-3)
        assert s.fit.overhead_s == pytest.approx(OVERHEAD, rel=1e-2)
        assert max(abs(e) for e in s.loo_errors) < 1e-3
        assert s.fast_fabric == "ib" and s.fast_fit.flops_per_s == pytest.approx(FLOPS, rel=1e-3)
        assert len(s.penalties) == 4  # two models x two multi-node counts
        for p in s.penalties:
            assert (p.fast.fabric, p.slow.fabric) == ("ib", "eth")
            assert p.predicted_fit == pytest.approx(p.measured, abs=1e-3)
            # The per-step fit takes the overhead for compute: more hides, so it predicts less penalty.
            assert p.predicted_step <= p.measured + 1e-9

    def test_noisy_runs_give_errors_of_the_size_of_the_noise(self):
        s = study(synthetic(noise=0.03, seed=4))
        assert s.fit.flops_per_s == pytest.approx(FLOPS, rel=0.15)
        assert 0.005 < max(abs(e) for e in s.loo_errors) < 0.15

    def test_link_efficiency_can_be_fitted(self):
        s = study(synthetic(efficiency=0.7), link_efficiency=None)
        assert s.efficiency_fitted and s.link_efficiency == 0.7 and 0.7 in EFFICIENCY_GRID
        assert s.fit.rms_error < 1e-3

    def test_one_fabric_has_no_penalty_table(self):
        s = study(synthetic(rates=(("ib", 2.0),)))
        assert s.penalties == ()
        assert "no configuration was measured on two fabrics" in study_lines(s)[-1]

    def test_nothing_to_study(self):
        with pytest.raises(ValueError, match="no measured training configurations"):
            study([])

    def test_the_table(self):
        lines = study_lines(study(synthetic(nodes=(1, 2))))
        assert lines[0] == "6 configuration(s); link efficiency 0.90 (assumed)"
        assert lines[1].startswith("fit on all: 2e+10 FLOP/s per rank, multi-node overhead 50.0 ms per step; "
                                   "in-sample step error RMS 0.0%")
        header = next(line for line in lines if line.strip().startswith("configuration  "))
        assert header.split() == ["configuration", "link", "Gbit/s", "launches", "measured", "ms", "predicted", "ms",
                                  "error", "measured", "tok/s", "predicted", "tok/s", "bound", "(fit", "on", "all)"]
        row = next(line for line in lines if line.strip().startswith("llama-wide n2x1 eth"))
        assert row.split()[3:5] == ["0.4", "3"] and row.split()[7] == "+0.0%"
        penalty = next(line for line in lines if line.strip().startswith("llama-wide n2x1  ib vs eth"))
        steps = {gbit: predict_step(JobShape(get_model("llama-wide"), 2, dtype="fp32"), flops_per_s=FLOPS,
                                    inter_gbit=gbit, overhead_s=OVERHEAD, link_efficiency=EFFICIENCY).step_s
                 for gbit in (2.0, 0.4)}
        slowdown = f"{(1 - steps[2.0] / steps[0.4]) * 100:+.1f}%"  # the model's own penalty, measured and predicted
        assert penalty.split()[8:11] == [slowdown, slowdown, "+0.0"] and penalty.split()[-1] == "communication-bound"
        assert lines[-1].startswith("penalty error: fit RMS 0.0 points; per step RMS ")
