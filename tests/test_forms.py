"""Uploads routed by their ``model`` form field (SPEC §17.2 "Forms"): the reader of
protocol/forms.py on its own, then through a gateway to a fake model server: the body is
forwarded byte for byte, ``model`` may come after a 5 MB file, and a form without a model or
with broken framing is a 400 in OpenAI's shape with nothing forwarded. The official
``openai`` SDK's transcription upload too."""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

import openai
import pytest
import trio

from protocol.errors import SluiceError
from protocol.forms import FORM_PATHS, MAX_FIELD, form_reader
from protocol.request_info import TimeoutClass
from tests.client import request
from tests.conftest import StartGateway
from tests.fakeupstream import FakeUpstream, ReceivedRequest, ResponseWriter
from tests.rawhttp import assert_refused_with_close

TRANSCRIBE = "/v1/audio/transcriptions"
BOUNDARY = "sluice-test-7d3f"
FORM_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def field(name: str, value: str) -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
            f"{value}\r\n").encode()


def file_part(data: bytes, name: str = "file", filename: str = "talk.wav") -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; "
            f"filename=\"{filename}\"\r\nContent-Type: audio/wav\r\n\r\n").encode() \
        + data + b"\r\n"


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def read(body: bytes, path: str = TRANSCRIBE, piece: int = 0) -> Any:
    reader = form_reader(path, [(b"content-type", FORM_TYPE.encode())])
    assert reader is not None
    step = piece or len(body) or 1
    for at in range(0, len(body), step):
        reader.feed(body[at:at + step])
    return reader.info(path)


# -- the reader ----------------------------------------------------------------------------


@pytest.mark.parametrize("piece", [0, 1, 7, 4096])
def test_model_before_or_after_the_file_in_any_pieces(piece: int) -> None:
    audio = os.urandom(20000) + f"\r\n--{BOUNDARY}x".encode()  # a near-boundary inside
    for body in (form(field("model", "whisper-1"), file_part(audio)),
                 form(file_part(audio), field("language", "en"), field("model", "whisper-1"))):
        info = read(body, piece=piece)
        assert (info.model, info.stream, info.doc, info.path) == (
            "whisper-1", False, None, TRANSCRIBE)


def test_the_stream_field_and_the_timeout_class() -> None:
    assert read(form(field("model", "m"), field("stream", "true"))).stream is True
    assert read(form(field("model", "m"), field("stream", "false"))).stream is False
    image = read(form(file_part(b"png", "image", "a.png"), field("model", "dall-e-2")),
                 "/v1/images/edits")
    assert image.timeout_class is TimeoutClass.IMAGE_GENERATION


def test_only_form_paths_with_a_form_content_type_are_read_as_forms() -> None:
    assert {"/v1/audio/transcriptions", "/v1/audio/translations",
                          "/v1/images/edits", "/v1/images/variations"} == FORM_PATHS
    assert form_reader("/v1/chat/completions", [(b"content-type", FORM_TYPE.encode())]) is None
    assert form_reader(TRANSCRIBE, [(b"content-type", b"application/json")]) is None
    assert form_reader(TRANSCRIBE, []) is None
    assert form_reader(TRANSCRIBE, [(b"content-type", b"Multipart/Form-Data; boundary=a")])


def read_all(reader: Any, body: bytes) -> None:
    reader.feed(body)
    reader.info(TRANSCRIBE)


def refusal(body: bytes, content_type: bytes = FORM_TYPE.encode()) -> SluiceError:
    reader = form_reader(TRANSCRIBE, [(b"content-type", content_type)])
    assert reader is not None
    with pytest.raises(SluiceError) as caught:
        read_all(reader, body)
    assert (caught.value.status, caught.value.code) == (400, "invalid_request")
    return caught.value


def test_forms_that_are_refused() -> None:
    assert refusal(form(file_part(b"abc"))).param == "model"  # no model
    assert refusal(form(field("model", ""))).param == "model"  # an empty one
    assert "closing boundary" in refusal(form(field("model", "m"))[:-8]).message
    assert "malformed" in refusal(b"no boundary here at all").message
    assert "malformed" in refusal(
        f"--{BOUNDARY}\r\nbroken header line\r\n\r\nx\r\n--{BOUNDARY}--\r\n".encode()).message
    assert "boundary" in refusal(form(field("model", "m")), b"multipart/form-data").message
    assert "longer than" in refusal(form(field("model", "m" * (MAX_FIELD + 1)))).message
    raw = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
           .encode() + b"\xff\xfe" + f"\r\n--{BOUNDARY}--\r\n".encode())
    assert "UTF-8" in refusal(raw).message


# -- through a gateway ---------------------------------------------------------------------


def recorder(up: FakeUpstream, path: str = TRANSCRIBE) -> list[ReceivedRequest]:
    got: list[ReceivedRequest] = []

    async def handler(req: ReceivedRequest, w: ResponseWriter) -> None:
        got.append(req)
        await w.json(200, {"text": "hello", "sha256": hashlib.sha256(req.body).hexdigest()})

    up.on("POST", path, handler)
    return got


async def test_a_5mb_upload_is_routed_by_its_last_field_byte_for_byte(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    got = recorder(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    body = form(file_part(os.urandom(5 << 20)), field("response_format", "json"),
                field("model", "fake-model"))
    with trio.fail_after(30):
        reply = await request(gw.unix, "POST", TRANSCRIBE, body,
                              [("content-type", FORM_TYPE)])
    assert reply.status == 200, reply.body[:300]
    assert reply.header("x-sluice-served-by") == "local:fake"
    assert len(got) == 1
    assert hashlib.sha256(got[0].body).hexdigest() == hashlib.sha256(body).hexdigest()
    assert dict(got[0].headers)[b"content-type"] == FORM_TYPE.encode()


async def test_no_model_or_broken_framing_is_a_400_and_nothing_is_forwarded(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    got = recorder(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    broken = file_part(os.urandom(300000))[:-2] + b"--not-the-boundary--\r\n"
    for body in (form(file_part(b"RIFF....WAVE")), broken,
                 form(field("model", "fake-model"))[:-10]):
        with trio.fail_after(20):
            reply = await request(gw.unix, "POST", TRANSCRIBE, body,
                                  [("content-type", FORM_TYPE)])
        assert reply.status == 400, reply.body[:300]
        error = reply.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    assert got == []
    again = await request(gw.unix, "POST", TRANSCRIBE, form(field("model", "fake-model")),
                          [("content-type", FORM_TYPE)])
    assert again.status == 200  # the gateway serves on
    assert len(got) == 1


async def test_the_openai_sdk_transcribes_through_the_gateway(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    got = recorder(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    audio = os.urandom(200000)

    def run() -> Any:
        with gw.openai_client("unix") as client:
            return client.audio.transcriptions.create(
                model="fake-model", file=("talk.wav", io.BytesIO(audio), "audio/wav"))

    with trio.fail_after(30):
        result = await trio.to_thread.run_sync(run)
    assert result.text == "hello"
    assert len(got) == 1
    assert audio in got[0].body

    def unknown() -> None:
        with gw.openai_client("unix") as client:
            client.audio.transcriptions.create(model="missing", file=("a.wav", b"x"))

    with pytest.raises(openai.APIStatusError) as caught:  # routed by its form: nobody has it
        await trio.to_thread.run_sync(unknown)
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "model_not_available"  # type: ignore[index]


async def test_a_form_broken_at_its_start_is_refused_before_its_end(
        upstream: FakeUpstream, start_gateway: StartGateway) -> None:
    """The reader is fed as the body arrives: an upload of 5 MB announced, whose first
    64 KiB do not start with its boundary, is answered 400 (and the connection closed, as
    for any refusal mid-body) before the rest is sent; nothing is forwarded."""
    got = recorder(upstream)
    gw = await start_gateway([("fake", upstream.url)])
    head = (f"POST {TRANSCRIBE} HTTP/1.1\r\nHost: localhost\r\nContent-Type: {FORM_TYPE}"
            f"\r\nContent-Length: {5 << 20}\r\n\r\n").encode()
    start = b"this is not a multipart body\r\n" + os.urandom(64 * 1024)
    reply = await assert_refused_with_close(gw.unix, head + start, 400, "invalid_request")
    assert b"malformed" in reply.body
    assert got == []
