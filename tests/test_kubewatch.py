"""keep_listing_and_watching: rounds until stopped, a doubling pause after errors."""

from __future__ import annotations

import logging
import threading

from gpushare.kubewatch import keep_listing_and_watching


class RecordingStop(threading.Event):
    """A stop event whose waits are recorded instead of slept."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        return self.is_set()


def test_errors_pause_with_a_doubling_backoff_and_a_good_round_resets_it(caplog) -> None:
    stop = RecordingStop()
    outcomes = ["fail", "fail", "fail", "ok", "fail", "stop"]
    errors: list[int] = []

    def round_() -> None:
        outcome = outcomes.pop(0)
        if outcome == "stop":
            stop.set()
        elif outcome == "fail":
            raise RuntimeError("connection dropped")

    with caplog.at_level(logging.WARNING):
        keep_listing_and_watching(
            round_,
            stop,
            "pods of n1",
            logging.getLogger("test"),
            backoff_min_s=0.5,
            backoff_max_s=1.5,
            on_error=lambda: errors.append(1),
        )
    assert stop.waits == [0.5, 1.0, 1.5, 0.5]
    assert len(errors) == 4 and outcomes == []
    assert caplog.messages[0] == "pods of n1: connection dropped; listing again in 0.5 s"
