"""Content hashes, manifests, signatures, environment fingerprints and provenance of a step's output."""
