"""The log tail of a failed task: the end of the attempt's Airflow log file, or the lines logged
in this process when that file is not on this machine."""

from __future__ import annotations

import logging

_TAIL = None


def capture_log_tail() -> None:
    """Keep the last lines logged in this process (idempotent; called at the start of a task)."""
    global _TAIL
    if _TAIL is None:
        from tidal.tracking.failures import LogTail

        _TAIL = LogTail()
        logging.getLogger().addHandler(_TAIL)


def log_tail() -> list[str]:
    """The captured lines, oldest first (empty if nothing was captured)."""
    return list(_TAIL.lines) if _TAIL is not None else []


def task_log_tail(dag_id: str, run_id: str, task_id: str, try_number: int | None, map_index: int = -1,
                  lines: int = 40) -> list[str]:
    """The last ``lines`` of the task attempt's Airflow log file, as ``time level logger: event``.

    Airflow's supervisor writes each attempt's log as JSON lines under ``[logging]
    base_log_folder`` (default template ``dag_id=…/run_id=…/task_id=…/[map_index=…/]attempt=N.log``);
    on a worker the file is local while the task runs, also with remote logging. Errors add their
    exception type and value. Returns [] when the file cannot be found or read.
    """
    import json
    from pathlib import Path

    from airflow.configuration import conf

    base = Path(conf.get("logging", "base_log_folder"))
    task_dir = base / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    if map_index >= 0:
        task_dir = task_dir / f"map_index={map_index}"
    path = task_dir / f"attempt={try_number}.log"
    if not path.is_file():
        return []
    out = []
    for raw in path.read_text(errors="replace").splitlines()[-4 * lines:]:
        try:
            event = json.loads(raw)
        except json.JSONDecodeError:
            out.append(raw[:1000])
            continue
        text = (f"{event.get('timestamp', '')} {event.get('level', '')} {event.get('logger', '')}: "
                f"{event.get('event', '')}")
        for detail in event.get("error_detail") or []:
            text += f" [{detail.get('exc_type')}: {str(detail.get('exc_value'))[:500]}]"
        out.append(text[:1500])
    return out[-lines:]
