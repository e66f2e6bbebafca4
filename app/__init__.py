"""Overtake checkpoint coordinator: REST service, lifecycle, persistence, blob store and event bus."""
