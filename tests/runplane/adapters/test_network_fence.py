"""The fence's changes go through libnftables in the process: a change is taken whole or refused with
nftables' own words, and a query answers whether the element is there."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from runplane.adapters import network_fence
from runplane.adapters.network_fence import Endpoint, FenceError

pytestmark = pytest.mark.skipif(network_fence.unavailable() is not None, reason="needs root and libnftables")


@pytest.fixture
def table() -> Iterator[str]:
    """A table of this test's own (never the machine's fence), removed after it."""
    name = f"rpt_fence_{secrets.token_hex(4)}"
    network_fence._nft(f"table inet {name} {{ set reach4 {{ type uid . ipv4_addr . inet_service; }}; }}\n")
    try:
        yield name
    finally:
        network_fence._nft(f"delete table inet {name}\n", check=False)


def _has(table: str, element: str) -> bool:
    return network_fence._nft(f"get element inet {table} reach4 {{ {element} }}", check=False)


def test_a_script_is_taken_whole_or_refused_with_nftables_words(table: str) -> None:
    endpoint = Endpoint("127.0.0.1", 5555)
    network_fence._nft(f"add element inet {table} reach4 {{ {endpoint.element(70001)} }}\n")
    assert _has(table, endpoint.element(70001))
    assert not _has(table, endpoint.element(70002))

    with pytest.raises(FenceError, match=r"nft refused: .*(No such file|does not exist|not found)"):
        network_fence._nft(
            f"add element inet {table} reach4 {{ {endpoint.element(70002)} }}\n"
            f"add element inet {table} no_such_set {{ 1 }}\n"
        )
    assert not _has(table, endpoint.element(70002)), "half of a refused script was applied"
