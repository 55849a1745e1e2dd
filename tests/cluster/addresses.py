"""Loopback addresses of the test cluster's nodes (tests/cluster/harness.py)."""

from __future__ import annotations


def node_address(index: int) -> str:
    """The loopback address of the ``index``-th node named in a session (1-based): ``127.0.2.1`` ..
    ``127.0.2.254``, then ``127.0.3.1`` ... (all of 127.0.0.0/8 is the loopback interface). A whole
    suite names a few hundred nodes; a fourth octet past 254 would be no address at all.

    Raises:
        ValueError: ``index`` is not in 1 .. 253 * 254.
    """
    if not 1 <= index <= 253 * 254:
        raise ValueError(f"node index {index} out of range")
    third, fourth = divmod(index - 1, 254)
    return f"127.0.{2 + third}.{1 + fourth}"
