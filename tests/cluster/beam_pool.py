"""Beam's Python SDK worker pool (``--environment_type=EXTERNAL``) bound to one node's own address.

This is Beam's own :class:`apache_beam.runners.worker.worker_pool_main.BeamFnExternalWorkerPoolServicer`
in process mode (each SDK worker a fresh ``python``, from this interpreter's directory on PATH), the
sidecar a Flink TaskManager pod runs. It binds its node's address (``Node.address``, which
``beam-worker-pool`` resolves to on that node alone), and every TaskManager reaches its own pool
at the same ``beam-worker-pool:PORT``.

Usage: ``python -m tests.cluster.beam_pool --address 10.70.0.3 --port 50000``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from concurrent import futures
from pathlib import Path

import grpc
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer, kill_process_gracefully

from tidal.data.beam_options import EXTERNAL_POOL_PORT

log = logging.getLogger("beam-pool")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True, help="the node's own address to bind")
    parser.add_argument("--port", type=int, default=EXTERNAL_POOL_PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s beam-pool %(levelname)s %(message)s")
    # the pool starts each SDK worker as `python -c ...`: this interpreter, with tidal importable
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)])
    pool = BeamFnExternalWorkerPoolServicer(use_process=True, state_cache_size=0, data_buffer_time_limit_ms=-1)
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    server.add_insecure_port(f"{args.address}:{args.port}")
    server.start()
    log.info("Started worker pool at %s:%d", args.address, args.port)
    try:
        server.wait_for_termination()
    finally:
        for proc in list(pool._worker_processes.values()):
            kill_process_gracefully(proc)


if __name__ == "__main__":
    main()
