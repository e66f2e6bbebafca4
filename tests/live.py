"""Test-side names for the local coordinator subprocess."""

from app.local import LocalCoordinator as LiveCoordinator
from app.local import free_port

__all__ = ["LiveCoordinator", "free_port"]
