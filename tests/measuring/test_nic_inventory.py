"""The ini's fabric_inventory lines: what one node of a fabric has, by fabric."""

from __future__ import annotations

import pytest

from pytest_fabric.measuring.nic_inventory import NicInventory, parse_inventory


def test_lines_by_fabric_with_comments_and_blanks_skipped():
    found = parse_inventory(["ib.nics = 8", "", "# a comment", "ib.gbit_per_nic = 400", "eth.nics=2"], ["ib", "eth"])
    assert found == {"ib": NicInventory(8, 400.0), "eth": NicInventory(2, None)}
    assert found["ib"].source == "ini fabric_inventory"
    assert parse_inventory([], ["ib"]) == {}


@pytest.mark.parametrize("line", ["ib.nics = eight", "nvlink.nics = 8", "ib.gbit_per_nic = -400", "ib.ports = 8",
                                  "ib.nics", "ib.gbit_per_nic = inf"])
def test_a_bad_line_is_named_with_how_to_write_it(line):
    with pytest.raises(ValueError, match="write 'FABRIC.nics = N' or 'FABRIC.gbit_per_nic = GBIT'") as err:
        parse_inventory([line], ["ib", "eth"])
    assert repr(line) in str(err.value) and "ib, eth" in str(err.value)

