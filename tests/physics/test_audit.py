"""``pytest-fabric audit FILE.csv``: the floor and the prediction applied to results measured elsewhere."""

from __future__ import annotations

import json

import pytest
from helpers import REPO, assert_one_line_error, run

from pytest_fabric.physics.floor import floor_for
from pytest_fabric.core.models import get_model

HEADER = "model,nodes,gpus_per_node,batch,seq,fabric,link_gbit,tokens_per_s"
# qwen2.5-7b, 2 nodes x 8 GPUs, 2 x 2048 tokens per GPU: 65,536 tokens per step.
TABLE = f"""{HEADER},activation_checkpointing
qwen2.5-7b,2,8,2,2048,ib,3200,131072,true
qwen2.5-7b,2,8,2,2048,eth,80,131072,true
qwen2.5-7b,2,8,2,2048,eth-slow,80,4096,true
"""


@pytest.fixture
def table(tmp_path):
    def write(text: str, name: str = "table.csv"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


def test_table_flags_a_step_faster_than_the_link_and_pairs_fabrics(capsys, table):
    code, out, err = run(capsys, "audit", table(TABLE))
    assert code == 1, err  # a row is impossible
    floor = floor_for(get_model("qwen2.5-7b"), 2, 80)  # 2.18 s over 80 Gbit/s
    rows = {line.split()[0]: line for line in out.splitlines() if line[:3].strip().isdigit()}
    # 65,536 tokens at 131,072 tokens/s: a 0.5 s step.
    assert "0.500 s" in rows["2"] and f"{floor.step_s:.3f} s" in rows["2"] and rows["2"].endswith("IMPOSSIBLE")
    assert rows["1"].endswith("plausible") and rows["3"].endswith("plausible")
    needed = floor.bytes * 8 / 0.5 / 1e9
    assert f"row 2 (qwen2.5-7b, 2 nodes, eth): 0.5 s/step needs >= {needed:.3g} Gbit/s per node" in out
    assert "this traffic did not cross eth" in out
    # Penalties against the fastest fabric of the shape: measured 0% and 1 - 4096/131072.
    assert "row 2 eth vs row 1 ib (qwen2.5-7b, 2 nodes): measured +0.0%, predicted +" in out
    assert "row 3 eth-slow vs row 1 ib (qwen2.5-7b, 2 nodes): measured +96.9%, predicted +" in out
    assert "2 of 3 row(s) plausible, 1 impossible" in out


def test_json_lists_rows_with_their_input_columns_and_plausible(capsys, table):
    code, out, _ = run(capsys, "audit", "--json", table(TABLE))
    assert code == 1
    rows = json.loads(out)
    assert [r["plausible"] for r in rows] == [True, False, True]
    assert rows[1]["fabric"] == "eth" and rows[1]["tokens_per_s"] == "131072" and rows[1]["nodes"] == "2"
    assert rows[1]["measured_step_s"] == pytest.approx(0.5)
    assert rows[1]["floor_step_s"] == pytest.approx(floor_for(get_model("qwen2.5-7b"), 2, 80).step_s)
    assert rows[2]["penalty"]["against"] == "ib"
    assert rows[2]["penalty"]["measured"] == pytest.approx(1 - 4096 / 131072)
    assert 0 < rows[2]["penalty"]["predicted"] < 1
    assert "penalty" not in rows[0]


def test_the_tolerance_decides_a_step_just_beyond_the_link(capsys, table):
    # 65,536 tokens at 32,768 tokens/s: a 2.0 s step needs 87 Gbit/s on an 80 Gbit/s link.
    path = table(f"{HEADER}\nqwen2.5-7b,2,8,2,2048,eth,80,32768\n")
    code, out, _ = run(capsys, "audit", path)
    assert code == 0 and "1 of 1 row(s) plausible" in out  # within the default 10%
    assert run(capsys, "audit", "--tolerance", "0", path)[0] == 1
    code, _, err = run(capsys, "audit", "--tolerance", "1.5", path)
    assert_one_line_error(code, err, "--tolerance must be a fraction in [0, 1)")


def test_hybrid_sharding_and_fp32_change_the_floor(capsys, table):
    code, out, _ = run(capsys, "audit", "--json", table(
        f"{HEADER},sharding,dtype\nqwen2.5-7b,2,8,2,2048,eth,80,4096,hybrid,fp32\n"))
    assert code == 0
    (row,) = json.loads(out)
    total, _ = get_model("qwen2.5-7b").param_count()
    # HSDP moves the fp32 gradients once each way: 4 bytes per parameter.
    assert row["floor_bytes_per_node"] == pytest.approx(4 * total)


def test_a_hugging_face_config_path_is_a_model(capsys, table, tmp_path):
    config = {"model_type": "llama", "hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 2,
              "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 4096}
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(config))
    code, out, err = run(capsys, "audit", "--json", table(f"{HEADER}\ntiny/config.json,2,1,1,32,eth,0.4,100\n"))
    assert code == 0, err
    (row,) = json.loads(out)
    # The same architecture as the catalog's llama-wide: the same floor.
    assert row["floor_bytes_per_node"] == pytest.approx(floor_for(get_model("llama-wide"), 2, 0.4).bytes)


@pytest.mark.parametrize("text, expected", [
    ("model,nodes,batch,seq,fabric,link_gbit,tokens_per_s\nqwen2.5-7b,2,2,2048,eth,80,1\n",
     "missing column(s) gpus_per_node"),
    (f"{HEADER}\ngpt-9,2,8,2,2048,eth,80,1\n", "row 1, column model: unknown model 'gpt-9'"),
    (f"{HEADER}\nqwen2.5-7b,2,8,2,2048,eth,80,1\nqwen2.5-7b,two,8,2,2048,eth,80,1\n",
     "row 2, column nodes: 'two' is not a whole number"),
    (f"{HEADER}\nqwen2.5-7b,2,8,2,2048,eth,fast,1\n", "row 1, column link_gbit: 'fast' is not a number"),
    (f"{HEADER}\nqwen2.5-7b,2,8,2,2048,eth,80,0\n", "row 1, column tokens_per_s: '0' must be positive"),
    (f"{HEADER}\nqwen2.5-7b,2,8,-2,2048,eth,80,1\n", "row 1, column batch: '-2' must be positive"),
    (f"{HEADER},sharding\nqwen2.5-7b,2,8,2,2048,eth,80,1,zero9\n", "row 1, column sharding: 'zero9' is not one of"),
    (f"{HEADER},dtype\nqwen2.5-7b,2,8,2,2048,eth,80,1,int3\n", "row 1, column dtype: 'int3' is not one of"),
    (f"{HEADER}\n", "no rows under the header"),
])
def test_bad_csv_is_one_line_naming_row_and_column(capsys, table, text, expected):
    code, _, err = run(capsys, "audit", table(text))
    assert_one_line_error(code, err, expected)


def test_a_missing_file_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "audit", str(tmp_path / "nope.csv"))
    assert_one_line_error(code, err, "nope.csv")


def test_the_documented_table_audits_as_the_readme_says(capsys):
    code, out, _ = run(capsys, "audit", str(REPO / "docs" / "audit" / "ib-vs-ethernet-qwen2.5-7b.csv"))
    assert code == 1
    verdicts = [line.split()[-1] for line in out.splitlines() if line[:3].strip().isdigit()]
    assert verdicts == ["plausible", "IMPOSSIBLE", "plausible", "plausible", "IMPOSSIBLE", "plausible", "IMPOSSIBLE"]
