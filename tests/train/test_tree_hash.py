"""tree_sha256 is a content hash: the same values give the same hash however the leaves are sharded (rows,
columns, replicated, one device), and any changed element, dtype, shape or key changes it. Four CPU devices in
a subprocess, so each layout is a real jax.Array of several shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tidal.train.tree_hash import tree_sha256

mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
rng = np.random.default_rng(0)
tree = {"w": rng.standard_normal((8, 6)).astype(np.float32), "e": rng.standard_normal((4, 2, 6)).astype(jnp.bfloat16),
        "s": np.float32(3.5), "v": np.arange(5, dtype=np.int32)}
def put(specs):
    return {k: jax.device_put(v, NamedSharding(mesh, specs.get(k, P()))) for k, v in tree.items()}
layouts = {"host": tree, "replicated": put({}), "rows": put({"w": P("a"), "e": P("b")}),
           "columns": put({"w": P(None, "b"), "e": P(None, None, "a")}),
           "both": put({"w": P("a", "b"), "e": P("b", "a")})}
hashes = {name: tree_sha256(t) for name, t in layouts.items()}
shards = len(layouts["both"]["w"].addressable_shards)
changed = dict(tree, w=tree["w"].copy()); changed["w"][7, 5] = np.nextafter(changed["w"][7, 5], 1)
other = {"value": tree_sha256(changed), "dtype": tree_sha256(dict(tree, v=tree["v"].astype(np.uint32))),
         "shape": tree_sha256(dict(tree, v=tree["v"].reshape(5, 1))),
         "key": tree_sha256({("x" if k == "v" else k): v for k, v in tree.items()})}
print(json.dumps({"hashes": hashes, "other": other, "shards": shards}))
"""


def test_the_hash_is_the_same_on_every_layout_and_changes_with_the_content():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["shards"] == 4
    assert len(set(got["hashes"].values())) == 1, got["hashes"]
    [same] = set(got["hashes"].values())
    assert all(h != same for h in got["other"].values()) and len(set(got["other"].values())) == 4, got
