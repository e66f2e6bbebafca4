"""A zombie subtask learns that its attempt is over from the coordinator's event stream, on the feed's thread, while
its loop may be inside a sink's commit: the feed halts the loop and tells the chain's sinks at once."""

from __future__ import annotations

import threading

from spark_plugin.api.operators import FunctionOperator, SinkOperator
from spark_plugin.connectors.base import Sink
from spark_plugin.network.mailbox import Mailbox
from spark_plugin.task.chain import OperatorChain
from spark_plugin.task.coordination import AttemptEnded
from spark_plugin.task.events import EventFeed


class Recording(Sink):
    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def write(self, record) -> None:
        pass

    def attempt_over(self, reason: str) -> None:
        self.told.append((reason, threading.current_thread().name))


class EndsAfterOneEvent:
    """A stream that the coordinator ends as a later attempt starts."""

    def __iter__(self):
        yield from ()
        raise AttemptEnded("the coordinator refuses this attempt's token: attempt 3 started")

    def close(self) -> None:
        pass


def test_the_feed_halts_the_loop_and_tells_every_sink_of_the_chain_on_its_own_thread():
    a, b = Recording(), Recording()
    chain = OperatorChain([FunctionOperator("m", lambda r: [r]), SinkOperator("a", a), SinkOperator("b", b)])
    feed = EventFeed(EndsAfterOneEvent(), 2, Mailbox(), on_ended=chain.attempt_over)
    feed.start()
    feed._thread.join(10)
    assert feed.ended == "the coordinator refuses this attempt's token: attempt 3 started"
    assert a.told == b.told == [("the coordinator refuses this attempt's token: attempt 3 started", "events")]

