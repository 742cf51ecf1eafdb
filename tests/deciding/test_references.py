"""The declarative suite file: matching, precedence, expectations and every kind of bad input."""

import pytest

from pytest_fabric.core.case import Case
from pytest_fabric.deciding.references import ReferenceError, References

SUITE = """
[[gate]]
fabric = "eth"
within = 0.05

[[gate]]
model = "llama-wide"
fabric = "eth"
ahead = 0.30

[[gate]]
model = "llama-wide"
nodes = [4, 8]
fabric = "eth"
ahead = 0.50

[[expect]]
model = "qwen2-tiny"
nodes = 2
fabric = "ib"
tokens_per_s = [30000.0, -0.10, 0.20]
"""


@pytest.fixture
def refs(tmp_path):
    path = tmp_path / "suite.toml"
    path.write_text(SUITE)
    return References.load(path)


def test_most_specific_entry_wins(refs):
    assert refs.within(Case("qwen2-tiny", 2, "eth"), default=0.2) == 0.05
    assert refs.ahead(Case("llama-wide", 2, "eth"), default=0.2) == 0.30
    assert refs.ahead(Case("llama-wide", 8, "eth"), default=0.2) == 0.50
    assert refs.ahead(Case("qwen2-tiny", 2, "roce"), default=0.2) == 0.2  # nothing matches: the default


def test_expectation_bounds_are_relative(refs):
    case = Case("qwen2-tiny", 2, "ib")
    assert refs.violations(case, {"tokens_per_s": 27001.0}) == []
    assert refs.violations(case, {"tokens_per_s": 35999.0}) == []
    [low] = refs.violations(case, {"tokens_per_s": 26000.0})
    assert "26000 outside the reference 30000 [-10%, +20%] = [27000, 36000]" in low
    assert refs.violations(Case("qwen2-tiny", 4, "ib"), {"tokens_per_s": 1.0}) == []  # other node count


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[[gate]]\nfabric = 'eth'\n", "give 'within = 0.05'"),
        ("[[gate]]\nwithin = 1.5\n", "fraction in [0, 1)"),
        ("[[gate]]\nwithin = '0.05'\n", "fraction"),
        ("[[gate]]\nnodes = 0\nwithin = 0.1\n", "'nodes' must be"),
        ("[[gate]]\nmodle = 'x'\nwithin = 0.1\n", "unknown key(s) modle"),
        ("[[expect]]\ntokens_per_s = [100, 0.1, 0.2]\n", "lower <= 0"),
        ("[[expect]]\ntokens_per_s = 100\n", "[value, lower, upper]"),
        ("[[expect]]\nmodel = 'x'\n", "at least one of"),
        ("[gates]\nx = 1\n", "unknown section(s) gates"),
        ("gate = 3\n", "list of tables"),
        ("[[gate]\n", "not valid TOML"),
        ("[[gate]]\nwithin = __import__('os')\n", "not valid TOML"),  # nothing is evaluated
    ],
)
def test_bad_suite_files_say_what_to_write(tmp_path, text, fragment):
    path = tmp_path / "suite.toml"
    path.write_text(text)
    with pytest.raises(ReferenceError) as info:
        References.load(path)
    assert fragment in str(info.value) and str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ReferenceError, match="does not exist"):
        References.load(tmp_path / "nope.toml")


@pytest.mark.parametrize("section, entry, fix", [
    ("gate", 'fabric = "eth"\nwithin = 0.05\nreference = "roce"', "compares against the reference fabric 'ib'"),
    ("expect", 'fabric = "ib"\nbusbw_gbps = [1.6, -0.1, 0.1]', "no suite checks a busbw expectation"),
])
def test_keys_nothing_would_check_are_refused_saying_what_to_write(tmp_path, section, entry, fix):
    """Parsed and never used before: such an expectation was silently never checked."""
    path = tmp_path / "suite.toml"
    path.write_text(f"[[{section}]]\n{entry}\n")
    with pytest.raises(ReferenceError) as info:
        References.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: [[{section}]] #1: '") and "is not supported: " in message
    assert fix in message and "remove '" in message
