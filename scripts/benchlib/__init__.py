"""Helpers for scripts/bench: the side-by-side benchmark of zvfs and its peers."""
