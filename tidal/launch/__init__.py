"""Launchers: decide *where* the training entrypoint runs (local subprocess, later pods)."""
