"""The fabric table: presets, user-defined fabrics, overrides and their errors."""

import pytest

from pytest_fabric.core.fabrics import FABRICS, FabricConfigError, build_table


def test_presets_force_their_transport():
    # NCCL_NET forces the transport, so a missing fabric fails at start instead of falling back.
    assert {name: f.nccl_env["NCCL_NET"] for name, f in FABRICS.items()} == {
        "ib": "IB", "roce": "IB", "efa": "Libfabric", "eth": "Socket"}
    assert FABRICS["eth"].nccl_env["NCCL_IB_DISABLE"] == "1"
    assert FABRICS["efa"].nccl_env["FI_PROVIDER"] == "efa"


def test_user_fabric_copies_its_base_and_takes_overrides():
    table = build_table(defines=["roce-dc2: roce"],
                        env_overrides=["roce-dc2.NCCL_IB_GID_INDEX=5", "roce-dc2.NCCL_IB_HCA==mlx5_2",
                                       "roce-dc2.NCCL_IB_TIMEOUT="],
                        rates={"roce-dc2": 1500})
    f = table["roce-dc2"]
    assert f.nccl_env["NCCL_IB_GID_INDEX"] == "5"
    assert f.nccl_env["NCCL_IB_HCA"] == "=mlx5_2"  # NCCL's exact-match '=' survives
    assert "NCCL_IB_TIMEOUT" not in f.nccl_env  # an empty value removes the variable
    assert f.emulated_mbit == 1500
    assert table["roce"].nccl_env["NCCL_IB_GID_INDEX"] == "3"  # the base is untouched


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"defines": ["x: nosuch"]}, "'NAME: BASE'"),
        ({"defines": ["Bad Name: ib"]}, "'NAME: BASE'"),
        ({"defines": ["eth-hybrid: eth"]}, "not ending in '-hybrid'"),
        ({"env_overrides": ["nosuch.NCCL_NET=IB"]}, "'FABRIC.VARIABLE=VALUE'"),
        ({"env_overrides": ["ib.lowercase=1"]}, "'FABRIC.VARIABLE=VALUE'"),
        ({"env_overrides": ["ib.NCCL_NET"]}, "'FABRIC.VARIABLE=VALUE'"),
        ({"rates": {"nosuch": 10}}, "unknown fabric"),
        ({"rates": {"eth": 0}}, "positive"),
    ],
)
def test_bad_definitions_say_how_to_write_them(kwargs, fragment):
    with pytest.raises(FabricConfigError, match=fragment.replace(".", r"\.")):
        build_table(**kwargs)
