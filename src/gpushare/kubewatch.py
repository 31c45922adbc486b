"""List, then watch: how the extender, the device plugin and the monitor keep their view of
Kubernetes objects without a LIST per question.

A round lists the objects once (the caller replaces its whole view with them), then watches
from the list's resourceVersion, handing each event on, until the resync interval has passed
or the caller stops; a watch error (an expired version, a dropped connection) ends the round
with an exception. ``keep_listing_and_watching`` runs rounds until stopped, with a growing
pause after each error. Objects are plain dicts in the Kubernetes JSON shape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightkube import Client

Object = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects: a resource, in all namespaces or none, narrowed by field selectors."""

    resource: Any  # a lightkube resource class (Pod, Node)
    namespaced: bool = False
    fields: dict[str, str] | None = None

    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"namespace": "*"} if self.namespaced else {}
        if self.fields:
            kwargs["fields"] = self.fields
        return kwargs


def list_objects(client: Client, selection: Selection) -> tuple[list[Object], str]:
    """The selected objects and the resourceVersion the list was made at."""
    listing = client.list(selection.resource, **selection.kwargs())
    objects = [obj.to_dict() for obj in listing]
    return objects, str(listing.resourceVersion)


def list_and_watch(
    client: Client,
    selection: Selection,
    on_list: Callable[[list[Object]], None],
    on_event: Callable[[str, Object], None],
    stopping: threading.Event,
    resync_s: float,
) -> None:
    """One round: list (``on_list``), then watch (``on_event(kind, object)``) until
    ``resync_s`` has passed or ``stopping`` is set. API errors propagate."""
    objects, version = list_objects(client, selection)
    on_list(objects)
    resync_at = time.monotonic() + resync_s
    for kind, obj in client.watch(
        selection.resource, resource_version=version, server_timeout=60, **selection.kwargs()
    ):
        if stopping.is_set():
            return
        on_event(kind, obj.to_dict())
        if time.monotonic() > resync_at:
            return


def keep_listing_and_watching(
    round_: Callable[[], None],
    stopping: threading.Event,
    what: str,
    log: logging.Logger,
    backoff_min_s: float = 1.0,
    backoff_max_s: float = 30.0,
    on_error: Callable[[], None] | None = None,
) -> None:
    """Run ``round_`` until ``stopping`` is set; after an error, log one line and wait (the
    wait doubles up to ``backoff_max_s`` while errors repeat)."""
    backoff = backoff_min_s
    while not stopping.is_set():
        started = time.monotonic()
        try:
            round_()
        except Exception as error:
            if on_error is not None:
                on_error()
            if time.monotonic() - started > backoff_max_s:
                backoff = backoff_min_s  # the round ran a while: a fresh failure
            log.warning("%s: %s; listing again in %.1f s", what, error, backoff)
            stopping.wait(backoff)
            backoff = min(backoff * 2, backoff_max_s)
        else:
            backoff = backoff_min_s
