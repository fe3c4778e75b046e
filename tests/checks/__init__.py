"""Checks: scripts, run from the repository root (see README.md here)."""
