"""Embedding in the background: vaults finish their vectors on their own after ingest and unlock."""

from .background import BackgroundIndexer, Job

__all__ = ["BackgroundIndexer", "Job"]
