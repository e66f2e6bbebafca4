"""Picking a backend by URL scheme: one table per backend (database, blob store, event bus), MLflow's
`artifact_repository_registry` way. Settings validate URLs against these tables; the backends build from them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownScheme(ValueError):
    """A URL whose scheme no implementation is registered for; the message lists the known schemes."""


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


class SchemeRegistry(Generic[T]):
    """URL scheme -> factory of the implementation (`factory(url, **options)`)."""

    def __init__(self, what: str, setting: str, example: str) -> None:
        self.what = what
        self.setting = setting
        self.example = example
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, scheme: str, factory: Callable[..., T]) -> None:
        self._factories[scheme] = factory

    @property
    def schemes(self) -> list[str]:
        return list(self._factories)

    def check(self, url: str) -> str:
        """The URL's scheme, or UnknownScheme naming the setting, the URL and the schemes that are known."""
        scheme = scheme_of(url)
        if scheme not in self._factories:
            known = ", ".join(f"{s}://" for s in self._factories)
            raise UnknownScheme(
                f"{self.setting} {url!r}: no {self.what} for "
                + (f"scheme {scheme!r}" if scheme else "a URL without a scheme")
                + f"; the known schemes are {known} (e.g. {self.example})"
            )
        return scheme

    def create(self, url: str, **options) -> T:
        return self._factories[self.check(url)](url, **options)
