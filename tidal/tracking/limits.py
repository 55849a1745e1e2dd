"""MLflow's limits on keys and values, and the summary metrics a step run gets.

Limits (from ``mlflow.utils.validation``): param values are cut to 6000 chars, tag values to
8000, keys to 250; names keep only ``[/\\w.\\- :]``; batches hold at most 100 params/tags and
1000 metrics.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def _key(name: str) -> str:
    """A valid MLflow param/metric/tag key: bad characters become ``_``, at most 250 chars."""
    key = _BAD_KEY_CHARS.sub("_", str(name)) or "_"
    if len(key) > MAX_KEY:
        key = key[: MAX_KEY - 13] + "~" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return key


def _text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts -> ``{"a.b.c": value}``; lists and scalars become strings (JSON for lists).

    Keys are made valid MLflow keys (max 250 chars), values are cut to 6000 chars
    (MLflow's ``MAX_PARAM_VAL_LENGTH``).
    """
    flat: dict[str, str] = {}
    for name, value in params.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            flat.update(flatten_params(value, prefix=f"{key}."))
        else:
            flat[_key(key)] = _text(value, MAX_PARAM_VALUE)
    return flat


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))


def _chunks(items: list[T], size: int) -> Iterable[list[T]]:
    yield from (items[start:start + size] for start in range(0, len(items), size))


def summary_metrics(summary: dict[str, Any], history: list[dict[str, Any]],
                    curves: Iterable[str] = ()) -> tuple[dict[str, float], int]:
    """The numbers of a step's ``summary`` to log as metrics, and the step to log them at.

    A summary value is the end of the run, so it is logged at the run's last step (the summary's
    ``steps``, else the history's largest ``step``, else 0), never as a step-0 point in front of a
    curve (issue 21, item 7: that drew eval curves as a V). A key that already has a curve
    (a numeric key of ``history``, or one of ``curves``: the metrics a live run holds) is left out:
    its curve ends at the summary's value, and ``summary.json`` keeps the summary's own.

    Returns:
        ``({valid key: value}, step)``.
    """
    steps = [int(row["step"]) for row in history if "step" in row]
    last = summary.get("steps") if isinstance(summary.get("steps"), int) else max(steps, default=0)
    drawn = {_key(k) for row in history for k, v in row.items() if k != "step" and _is_number(v)}
    drawn |= {_key(k) for k in curves}
    return {_key(k): float(v) for k, v in sorted(summary.items())
            if _is_number(v) and _key(k) not in drawn}, int(last)
