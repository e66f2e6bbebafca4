"""The SSE parser follows the text/event-stream rules the coordinator's stream relies on."""

from client.sse import ServerSentEvent, SSEDecoder, iter_sse


def events(text: str) -> list[ServerSentEvent]:
    return list(iter_sse(text.splitlines()))


def test_an_event_ends_at_a_blank_line_and_carries_type_id_and_data():
    assert events('id: 7\nevent: checkpoint.triggered\ndata: {"id": 7}\n\n') == [
        ServerSentEvent(event="checkpoint.triggered", data='{"id": 7}', id="7")
    ]


def test_data_lines_are_joined_with_newlines():
    assert events("data: a\ndata:b\ndata:  c\n\n")[0].data == "a\nb\n c"


def test_comments_and_unknown_fields_are_ignored():
    assert events(": ping\nfoo: bar\ndata: x\n\n") == [ServerSentEvent(data="x")]


def test_an_event_without_data_is_not_dispatched_but_its_id_is_kept():
    decoder = SSEDecoder()
    assert list(iter_sse(["id: 3", "", "data: y", ""], decoder)) == [ServerSentEvent(data="y", id="3")]
    assert decoder.last_event_id == "3"


def test_the_last_event_id_carries_over_to_later_events_without_an_id():
    parsed = events("id: 5\ndata: a\n\ndata: b\n\n")
    assert [e.id for e in parsed] == ["5", "5"]


def test_retry_sets_the_reconnection_delay_only_when_it_is_a_number():
    decoder = SSEDecoder()
    parsed = list(iter_sse(["retry: 1500", "data: a", "", "retry: soon", "data: b", ""], decoder))
    assert [e.retry for e in parsed] == [1500, None]
    assert decoder.retry == 1500


def test_an_unfinished_event_at_the_end_of_the_stream_is_dropped():
    assert events("data: complete\n\ndata: cut off") == [ServerSentEvent(data="complete")]


def test_a_field_without_colon_has_an_empty_value():
    assert events("data\n\n") == [ServerSentEvent(data="")]
    decoder = SSEDecoder()
    decoder.decode("id")
    assert decoder.last_event_id == ""


def test_trailing_carriage_returns_are_stripped():
    assert events("data: x\r\n\r\n") == [ServerSentEvent(data="x")]
