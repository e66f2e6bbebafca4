"""Overtake Python SDK (sync and async httpx clients) and the `overtake` command line."""
