"""Failure alerts to a webhook, in Slack or PagerDuty Events API v2 format.

Configured by environment (the Helm chart sets it from a Secret):
``TIDAL_ALERT_WEBHOOK_URL`` (unset: no alerts), ``TIDAL_ALERT_FORMAT`` (``slack``, the
default, or ``pagerduty``), ``TIDAL_PAGERDUTY_ROUTING_KEY`` (the integration key PagerDuty
requires in every event) and ``TIDAL_ALERT_TIMEOUT_S`` (default 5 s).

Formats:
* Slack incoming webhook (api.slack.com/messaging/webhooks): ``{"text": ..., "blocks": [...]}``
  with a mrkdwn section; ``text`` is the notification fallback.
* PagerDuty Events API v2 (developer.pagerduty.com/docs/events-api-v2/trigger-events):
  ``{"routing_key", "event_action": "trigger", "dedup_key", "payload": {"summary" (<= 1024
  chars), "source", "severity", "component", "group", "class", "custom_details"}}``. The
  dedup key is the failure fingerprint plus the DAG id, so repeats of one failure update one
  incident instead of paging again.

Posting never raises: an alert that cannot be sent is logged (the failure itself is already
in the catalog).
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

from tidal.settings import current

log = logging.getLogger(__name__)
PAGERDUTY_SUMMARY_MAX = 1024  # Events API v2: payload.summary is at most 1024 characters


def headline(record: dict[str, Any]) -> str:
    """One line: which DAG/task failed, with what."""
    what = "gate failed" if record.get("failed_expectations") else record.get("exception_type", "failure")
    first = (record.get("message") or "").splitlines()[0][:300] if record.get("message") else ""
    return f"tidal {record.get('dag_id')}.{record.get('task_id')} {what}: {first}"


def slack_payload(record: dict[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook message for a failure record (tidal/tracking/failures.py)."""
    from tidal.tracking.failures import expectation_text

    lines = [
        f"*{headline(record)}*",
        f"run `{record.get('run_id')}` try {record.get('try_number')} step `{record.get('step_id')}`",
        f"fingerprint `{record.get('fingerprint')}` recipe hash `{str(record.get('recipe_hash'))[:12]}`",
    ]
    lines += [f"• {expectation_text(c)}" for c in record.get("failed_expectations", [])[:10]]
    if record.get("mlflow_link"):
        lines.append(f"<{record['mlflow_link']}|MLflow run>")
    return {"text": headline(record),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}]}


def pagerduty_payload(record: dict[str, Any], routing_key: str) -> dict[str, Any]:
    """A PagerDuty Events API v2 trigger event for a failure record."""
    details = {k: record.get(k) for k in ("dag_id", "task_id", "run_id", "try_number", "step_id", "recipe",
                                          "recipe_hash", "exception_type", "message", "mlflow_link")}
    details["failed_expectations"] = record.get("failed_expectations", [])
    details["log_tail"] = (record.get("log_tail") or [])[-10:]
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": f"tidal-{record.get('dag_id')}-{record.get('fingerprint')}",
        "payload": {
            "summary": headline(record)[:PAGERDUTY_SUMMARY_MAX],
            "source": f"airflow/{record.get('dag_id')}",
            "severity": "error" if record.get("failed_expectations") else "critical",
            "component": str(record.get("task_id")),
            "group": str(record.get("recipe")),
            "class": str(record.get("exception_type")),
            "custom_details": details,
        },
    }


def post_json(url: str, payload: dict[str, Any], timeout_s: float = 5.0) -> int:
    """POST ``payload`` as JSON; returns the HTTP status.

    Raises:
        urllib.error.URLError / OSError: the webhook is unreachable or answers an error.
    """
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.status


def send_alert(record: dict[str, Any], env: dict[str, str] | None = None) -> int | None:
    """Post ``record`` to the configured webhook; returns the HTTP status, None if off or failed."""
    if env is None:
        env = current().child_env()
    url = env.get("TIDAL_ALERT_WEBHOOK_URL")
    if not url:
        return None
    fmt = env.get("TIDAL_ALERT_FORMAT", "slack")
    if fmt == "pagerduty":
        payload = pagerduty_payload(record, env.get("TIDAL_PAGERDUTY_ROUTING_KEY", ""))
    elif fmt == "slack":
        payload = slack_payload(record)
    else:
        log.error("TIDAL_ALERT_FORMAT=%r: use slack or pagerduty; alert not sent", fmt)
        return None
    try:
        return post_json(url, payload, float(env.get("TIDAL_ALERT_TIMEOUT_S", "5")))
    except Exception as err:  # noqa: BLE001 - an alert never fails a callback
        log.error("alert to %s failed: %s: %s", url, type(err).__name__, err)
        return None
