"""Which fields of a file source's records fetch reads: the text, and the record's own id and
metadata it keeps (:class:`FieldSpec`), and the checks that a field named in the recipe exists.

Kept fields let a user map tidal's documents back to their own records: the fetch step writes
them, as one JSON object per record (``{"id": "doc-7", "url": "https://..."}``, keys sorted, the
user's own field names and values), into the ``fields`` column of ``raw.parquet``; the clean step
carries that column into the document shards, ``removed.parquet`` and ``quarantine.parquet``. It
never enters the text or tidal's document id (sha256 of the normalized text), and the tokenize
step does not read it.

Rules (a mistake in the recipe fails the fetch step before anything is committed, with one
:class:`SourceError` naming the file, the field and what the file has):

* Parquet: the file's schema must hold ``text_field``, every ``keep_fields`` column and an
  explicit ``id_field`` (the default ``id`` is kept when the column exists);
* JSONL: of every file with at least one JSON object, some object must hold ``text_field``,
  each ``keep_fields`` key and an explicit ``id_field`` (a single record without one is
  quarantined as ``missing_text_field``, or keeps no value for that field); the error lists the
  keys of the file's first :data:`SAMPLE_RECORDS` objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ID_FIELD = "id"
SAMPLE_RECORDS = 5  # JSONL objects whose keys a field error lists


class SourceError(ValueError):
    """A source's setting does not match its data: a field it names is not there, or its ``path``
    is gone. ``field`` is the setting at fault (``text_field``, ``id_field``, ``keep_fields``,
    ``path``); the message names the file and what it has. The fetch step prefixes
    ``sources.<name>.<field>``; the ``tidal`` command prints it as one ``error:`` line."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class FieldSpec:
    """The fields a reader takes from each record.

    Attributes:
        text: JSON key / Parquet column of the document text.
        id_field: the record's own id; ``None``: ``id``, kept only where present.
        keep: metadata fields to keep (``keep_fields``), in the recipe's order.
    """

    text: str = "text"
    id_field: str | None = None
    keep: tuple[str, ...] = ()

    def kept_names(self) -> tuple[str, ...]:
        """The fields copied into ``fields``: the id field then ``keep``, each once."""
        names = [self.id_field or DEFAULT_ID_FIELD, *self.keep]
        return tuple(dict.fromkeys(names))

    def required(self) -> list[tuple[str, str]]:
        """``[(setting, field name)]`` that must exist in the data: the text, an explicit id, each kept field."""
        need = [("text_field", self.text)]
        if self.id_field is not None:
            need.append(("id_field", self.id_field))
        need += [("keep_fields", name) for name in self.keep]
        return need

    def record_fields(self, record: dict[str, Any]) -> str | None:
        """The ``fields`` value of one record: canonical JSON of the kept fields it holds, or ``None``
        when it holds none. Values JSON cannot hold (dates, bytes) are written as their ``repr``."""
        kept = {name: record[name] for name in self.kept_names() if name in record}
        if not kept:
            return None
        return json.dumps(kept, sort_keys=True, ensure_ascii=False, default=repr)

    def check_columns(self, rel: str, columns: list[str]) -> None:
        """Check a Parquet file's columns hold every required field.

        Raises:
            SourceError: naming the file, the missing column and the columns it has.
        """
        for setting, name in self.required():
            if name not in columns:
                raise SourceError(f"{rel} has no column {name!r} (its columns: {', '.join(columns)})", setting)


@dataclass
class JsonlFieldCheck:
    """Follows one JSONL file's objects (:meth:`seen`) and fails when no object held a required
    field (:meth:`finish`), listing the keys of the first :data:`SAMPLE_RECORDS` objects."""

    spec: FieldSpec
    rel: str
    objects: int = 0
    found: set[str] = field(default_factory=set)
    sample: dict[str, None] = field(default_factory=dict)

    def seen(self, obj: dict[str, Any]) -> None:
        """Count one JSON object of the file."""
        self.objects += 1
        if self.objects <= SAMPLE_RECORDS:
            self.sample.update(dict.fromkeys(obj))
        for _, name in self.spec.required():
            if name in obj:
                self.found.add(name)

    def finish(self) -> None:
        """Raise if the file held objects and none of them had a required field.

        Raises:
            SourceError: naming the file, the field and the keys seen.
        """
        if not self.objects:
            return
        for setting, name in self.spec.required():
            if name not in self.found:
                keys = ", ".join(self.sample) or "none"
                raise SourceError(
                    f"no record of {self.rel} has the field {name!r} ({self.objects} JSON object(s) read; "
                    f"the first {min(self.objects, SAMPLE_RECORDS)} have: {keys})", setting)
