"""protocol.websocket.text_frame: the frames the events feed writes itself are what a
WebSocket client reads (wsproto as the client, RFC 6455), at every length boundary."""

from __future__ import annotations

import pytest
import wsproto
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType
from wsproto.events import AcceptConnection, Request, TextMessage

from protocol.websocket import text_frame


def _pair() -> tuple[wsproto.WSConnection, wsproto.WSConnection]:
    client = wsproto.WSConnection(ConnectionType.CLIENT)
    server = wsproto.WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="localhost", target="/api/v1/events")))
    list(server.events())
    client.receive_data(server.send(AcceptConnection()))
    list(client.events())
    return client, server


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_same_bytes_as_wsproto_at_each_length_boundary(size: int) -> None:
    client, server = _pair()
    text = "x" * size
    assert text_frame(text) == server.send(TextMessage(data=text))
    client.receive_data(text_frame(text) + text_frame("after"))
    got = [e for e in client.events() if isinstance(e, TextMessage)]
    assert [(e.data, e.message_finished) for e in got] == [(text, True), ("after", True)]


@given(st.text(max_size=300))
@settings(max_examples=200, derandomize=True)
def test_any_text_reads_back_whole(text: str) -> None:
    client, _ = _pair()
    client.receive_data(text_frame(text))
    (event,) = list(client.events())
    assert isinstance(event, TextMessage)
    assert (event.data, event.message_finished) == (text, True)


def test_a_lone_surrogate_is_sent_as_a_question_mark() -> None:
    client, _ = _pair()
    client.receive_data(text_frame('{"model":"a\ud800b"}'))
    (event,) = list(client.events())
    assert isinstance(event, TextMessage)
    assert event.data == '{"model":"a?b"}'
