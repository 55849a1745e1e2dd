"""Retries of small ranged reads from a bucket, which the AWS SDK under pyarrow does not retry.

Why this exists: :class:`pyarrow.fs.S3FileSystem` retries 5xx and throttling answers through its retry
strategy (``AwsStandardS3RetryStrategy``, :data:`tidal.files.step_files.S3_MAX_ATTEMPTS`) only when the
error body fits the buffer of the read. A ranged GET of fewer bytes than S3's XML error document (about
150 bytes: a zip member header, a parquet footer length, a ``.npy`` row) fails instead with
``OSError: AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream``,
which the SDK classifies as final. Found with tests/storage/servers.py's fault proxy answering 1 request
in 20 with 503 SlowDown: a 30-byte ``read_at`` failed on the first injected error, a 4 KiB one never.
So these reads retry here, with the same bound and AWS's "full jitter" backoff
(https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("tidal.files")

MAX_ATTEMPTS = 8  # as the SDK's own strategy (tidal/files/step_files.py S3_MAX_ATTEMPTS)
BASE_DELAY_S = 0.05
MAX_DELAY_S = 5.0
# The AWS SDK's words for errors that a later attempt may not meet (aws-sdk-cpp CoreErrors and S3Errors,
# as pyarrow prints them), and the one its response stream gives when an error body overflows a small read.
TRANSIENT = ("INTERNAL_FAILURE", "SERVICE_UNAVAILABLE", "SLOW_DOWN", "THROTTLING", "REQUEST_TIMEOUT",
             "NETWORK_CONNECTION", "Failed to flush response stream", "curlCode", "Connection reset",
             "Broken pipe", "Timeout was reached")

retried = 0  # reads retried by this process (tests and benches read it)


def is_transient(err: BaseException) -> bool:
    """True if ``err`` is a bucket error that a later attempt may not meet (5xx, throttling, a reset or
    timed-out connection, an error body that overflowed the read); False for everything else (a missing
    object, denied access, a bad range), which fails at once."""
    return isinstance(err, OSError) and any(word in str(err) for word in TRANSIENT)


def with_retries(read: Callable[[], T], *, what: str, attempts: int = MAX_ATTEMPTS,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``read()``, attempted up to ``attempts`` times while it raises a transient bucket error.

    ``read`` must be idempotent (a ranged GET, or a seek and then a read). Between attempts it waits a
    uniformly random time in [0, min(MAX_DELAY_S, BASE_DELAY_S * 2**attempt)] seconds.

    Args:
        what: names the object and range in the warning logged on each retry.

    Raises:
        ValueError: ``attempts`` < 1.
        OSError: the last transient error once ``attempts`` are spent, or the first other error.
    """
    global retried
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(attempts):
        try:
            return read()
        except OSError as err:
            if not is_transient(err) or attempt + 1 >= attempts:
                raise
            retried += 1
            delay = random.uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2 ** attempt))
            log.warning("%s: %s; retrying in %.2f s (attempt %d of %d)", what, str(err).splitlines()[0][:200],
                        delay, attempt + 2, attempts)
            sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


__all__ = ["MAX_ATTEMPTS", "is_transient", "with_retries"]
