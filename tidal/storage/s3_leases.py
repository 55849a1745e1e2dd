"""Step leases on an S3-compatible store: one object per step, compare-and-swap by ETag.

Also the S3 error codes the storage layer tests for (:func:`error_code`, :data:`MISSING`,
:data:`PRECONDITION`)."""

from __future__ import annotations

import json
from typing import Any

MISSING = {"404", "NoSuchKey", "NotFound"}
PRECONDITION = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


def error_code(err: Exception) -> str:
    """The S3 error code of a botocore ``ClientError`` (``"NoSuchKey"``, ``"412"`` ...), else ``""``."""
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


class S3LeaseStore:
    """Lease objects under ``{key_prefix}/{step_id}.json``; the version token is the ETag.

    Create is ``PutObject`` with ``If-None-Match: *``, replace is ``PutObject`` with
    ``If-Match: <ETag>`` (S3 conditional writes, GA since Aug/Nov 2024; moto ≥ 5.0.x serves
    both). A 412 PreconditionFailed or 409 ConditionalRequestConflict means another writer won.
    """

    def __init__(self, client: Any, bucket: str, key_prefix: str):
        self.client, self.bucket, self.key_prefix = client, bucket, key_prefix

    def _key(self, step_id: str) -> str:
        return f"{self.key_prefix}/{step_id}.json"

    def _put(self, step_id: str, body: bytes, **condition: str) -> str | None:
        try:
            response = self.client.put_object(Bucket=self.bucket, Key=self._key(step_id), Body=body,
                                              ContentType="application/json", **condition)
        except Exception as err:
            if error_code(err) in PRECONDITION | MISSING:
                return self._adopt(step_id, body)
            raise
        return response["ETag"]

    def _adopt(self, step_id: str, body: bytes) -> str | None:
        """After a refused conditional write: if the object holds exactly our body, our own first
        try succeeded and a retry (after a lost response) was refused; adopt its ETag."""
        current = self.read(step_id)
        if current is not None and current[0] == json.loads(body):
            return current[1]
        return None

    def create(self, step_id: str, body: bytes) -> str | None:
        """PutObject with ``If-None-Match: *``."""
        return self._put(step_id, body, IfNoneMatch="*")

    def read(self, step_id: str) -> tuple[dict[str, Any], str] | None:
        """GetObject: the record and its ETag, or None."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(step_id))
        except Exception as err:
            if error_code(err) in MISSING:
                return None
            raise
        return json.loads(response["Body"].read()), response["ETag"]

    def replace(self, step_id: str, body: bytes, token: str) -> str | None:
        """PutObject with ``If-Match: <ETag>``."""
        return self._put(step_id, body, IfMatch=token)

    def remove(self, step_id: str) -> None:
        """DeleteObject (unconditional; the lease was marked released by compare-and-swap first)."""
        self.client.delete_object(Bucket=self.bucket, Key=self._key(step_id))


__all__ = ["MISSING", "PRECONDITION", "S3LeaseStore", "error_code"]
