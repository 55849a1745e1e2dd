"""tidal: reproducible language-model pretraining pipelines (docs/architecture.md)."""

from tidal.logs import drop_known_noise

drop_known_noise()  # before any Beam import: its one warning about an unused optional client (tidal/logs.py)
