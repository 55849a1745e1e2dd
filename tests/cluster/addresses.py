"""Addresses of the test cluster's nodes (tests/cluster/network.py)."""

from __future__ import annotations


def node_address(index: int, octet: int) -> str:
    """The address of the ``index``-th node (1-based) in the cluster network ``10.<octet>.0.0/16``:
    ``10.<octet>.0.1`` .. ``10.<octet>.0.254``, then ``10.<octet>.1.1`` ... The gateway, ``10.<octet>.255.254``,
    is never a node's. A whole suite names a few hundred nodes per cluster at most.

    Raises:
        ValueError: ``index`` is not in 1 .. 253 * 254, or ``octet`` not in 0 .. 255.
    """
    if not 1 <= index <= 253 * 254:
        raise ValueError(f"node index {index} out of range")
    if not 0 <= octet <= 255:
        raise ValueError(f"octet {octet} out of range")
    third, fourth = divmod(index - 1, 254)
    return f"10.{octet}.{third}.{1 + fourth}"
