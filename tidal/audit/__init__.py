"""Checking committed work after the fact: verify a step's manifest and signature, trace lineage."""
