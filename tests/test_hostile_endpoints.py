"""The endpoints under hostile input (issue 56, items 6 to 10): a project that authenticates by
a proxy's header (``RemoteUserMiddleware``) with an ``async def`` rule, served by daphne; cross-site
writes; Unicode digits where numbers go; stream names that URLs must escape; a stream served as a
script or a style sheet to a page of the site (Chromium); the WebSocket Origin check held to
Django's own CSRF origin check; and every parameter of the endpoints fed arbitrary text by
hypothesis, which must answer a clear 4xx, never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.test import AsyncClient, RequestFactory, override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import pgstreams
from demo_project.servers import server_command
from pgstreams.models import Chunk, Stream
from pgstreams.origin import CsrfOriginValidator
from tests.conftest import OPEN_DURABLE, serving
from tests.helpers import ROOT, free_port, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINT = "/pgstreams/v1/stream/"
TEXT = {"Content-Type": "text/plain"}
CSRF = {"Cookie": f"csrftoken={'a' * 32}", "X-CSRFToken": "a" * 32}

# A project behind a front proxy that authenticates browsers and passes the user in a header
# (Django's RemoteUserMiddleware, whose async path reads the ``Remote-User`` request header), with
# an ``async def`` rule: the signed-in may write, and read their own streams and ownerless ones.
REMOTE_USER_SETTINGS = """
from demo_project.settings import *  # noqa: F403

MIDDLEWARE = [*MIDDLEWARE, "django.contrib.auth.middleware.RemoteUserMiddleware"]  # noqa: F405
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.RemoteUserBackend"]
PGSTREAMS = {**PGSTREAMS, "DURABLE_AUTHORIZE": "remote_user_settings.rule"}  # noqa: F405


async def rule(request, action, path, stream):
    user = request.user
    if action == "read":
        mine = user.is_authenticated and stream is not None and user.pk == stream.owner_id
        return stream is not None and (stream.owner_id is None or mine)
    return user.is_authenticated
"""


@contextlib.contextmanager
def remote_user_project(folder: Path) -> Iterator[str]:
    """The demo's ASGI application under daphne with REMOTE_USER_SETTINGS; yields its host:port."""
    (folder / "remote_user_settings.py").write_text(REMOTE_USER_SETTINGS)
    port = free_port()
    env = {"DJANGO_SETTINGS_MODULE": "remote_user_settings", "PYTHONPATH": f"{folder}:{ROOT}"}
    with serving(server_command("daphne", "demo_project.asgi:application", port), port, env=env) as host:
        yield host


@pytest.fixture(scope="module")
def remote_user_server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with remote_user_project(tmp_path_factory.mktemp("remote-user")) as host:
        yield host


def send(method: str, url: str, **options: object) -> httpx.Response:
    """One request, with no cookie from an earlier one (a client that keeps none)."""
    return httpx.request(method, url, timeout=20, **options)


def make_user(name: str) -> object:
    return get_user_model().objects.create_user(name)


def test_a_bodyless_put_under_an_async_rule_is_owned_by_the_user_the_middleware_signed_in(
    remote_user_server: str,
) -> None:
    """Item 6: the owner is request.user as the middleware set it, with or without a body."""
    alice = make_user("alice")
    base = f"http://{remote_user_server}{ENDPOINT}"
    # A browser behind the proxy: it sends the CSRF cookie and token, as any signed-in write must.
    as_alice = {**TEXT, "Remote-User": "alice", **CSRF}
    bodyless = send("PUT", f"{base}remote/bodyless", headers=as_alice)
    with_body = send("PUT", f"{base}remote/with-body", headers=as_alice, content="first")
    assert (bodyless.status_code, with_body.status_code) == (201, 201), bodyless.text
    appended = send("POST", f"{base}remote/bodyless", headers=as_alice, content="alice's secret")
    assert appended.status_code == 204, appended.text
    owners = dict(Stream.objects.filter(path__startswith="remote/").values_list("path", "owner_id"))
    assert owners == {"remote/bodyless": alice.pk, "remote/with-body": alice.pk}
    anonymous = send("GET", f"{base}remote/bodyless?offset=-1")
    assert anonymous.status_code == 403 and b"secret" not in anonymous.content
    assert send("GET", f"{base}remote/bodyless?offset=-1", headers={"Remote-User": "alice"}).text == "alice's secret"


class BearerUser:
    """A token authentication as plain Django views get it: ``Authorization: Bearer <username>``
    signs that user in (it sets ``request.user``, as such middleware do, and nothing else)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        scheme, _, name = request.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer":
            request.user = get_user_model().objects.get(username=name)
        return self.get_response(request)


async def everything_for_the_signed_in(request: Any, action: str, path: str, stream: Any) -> bool:
    return request.user.is_authenticated  # request.user, as the middleware set it, is loaded


async def test_a_bodyless_put_under_an_async_rule_is_owned_by_the_user_a_token_middleware_signed_in() -> None:
    """Item 6, with a token middleware: the plain create's owner came from ``auser()``, which
    knows nothing of the token (anonymous), so the stream was ownerless; the long way's, with a
    body, from ``request.user``."""
    bob = await sync_to_async(make_user)("bob")
    with override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE, "tests.test_hostile_endpoints.BearerUser"],
        PGSTREAMS={"DURABLE_AUTHORIZE": "tests.test_hostile_endpoints.everything_for_the_signed_in"},
    ):
        client, as_bob = AsyncClient(), {"Authorization": "Bearer bob"}
        bodyless = await client.put(ENDPOINT + "token/bodyless", content_type="text/plain", headers=as_bob)
        with_body = await client.put(ENDPOINT + "token/with-body", "x", content_type="text/plain", headers=as_bob)
        assert (bodyless.status_code, with_body.status_code) == (201, 201), bodyless.content
    owners = {
        path: owner
        async for path, owner in Stream.objects.filter(path__startswith="token/").values_list("path", "owner_id")
    }
    assert owners == {"token/bodyless": bob.pk, "token/with-body": bob.pk}


def test_a_cross_site_write_authenticated_by_a_proxys_header_is_refused_as_django_refuses_it(
    remote_user_server: str,
) -> None:
    """Item 7: no cookie, no Basic or Digest, but a user the middleware signed in: CSRF applies,
    as it does to an ordinary Django view; an explicit token scheme is exempt."""
    alice = make_user("alice")
    pgstreams.create_stream(path="remote/csrf", owner=alice, content_type="text/plain")
    host = remote_user_server
    cross_site = {**TEXT, "Remote-User": "alice", "Origin": "http://evil.example"}
    ordinary = send("POST", f"http://{host}/accounts/logout/", headers=cross_site, content="x")
    appended = send("POST", f"http://{host}{ENDPOINT}remote/csrf", headers=cross_site, content="forged")
    same_site = {**cross_site, "Origin": f"http://{host}"}
    no_token = send("POST", f"http://{host}{ENDPOINT}remote/csrf", headers=same_site, content="no token")
    bearer = {**cross_site, "Authorization": "Bearer a-token"}
    token = send("POST", f"http://{host}{ENDPOINT}remote/csrf", headers=bearer, content="by a token client")
    assert ordinary.status_code == 403
    assert appended.status_code == 403 and "CSRF" in appended.text, appended.text
    assert no_token.status_code == 403 and "CSRF" in no_token.text
    assert token.status_code == 204, token.text
    assert list(Chunk.objects.filter(stream__path="remote/csrf").values_list("data", flat=True)) == [
        "by a token client"
    ]


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_a_cursor_of_unicode_digits_is_ignored_as_any_cursor_this_server_did_not_give(
    open_durable_server: str, live: str
) -> None:
    """Item 8: ``str.isdigit`` took ``²``, which ``int()`` refuses: 500. A cursor only keys
    caches, and one this server did not give is ignored (as the protocol's reference server does)."""
    base = f"http://{open_durable_server}{ENDPOINT}cursor/{live}"
    assert send("PUT", base, headers=TEXT, content="x").status_code == 201
    with httpx.Client(timeout=20) as client:
        for cursor in ("²", "١٢٣", "9" * 30, "-5", " 7", "abc", "7"):
            query = {"offset": "-1", "live": live, "cursor": cursor}
            with client.stream("GET", base, params=query) as answer:  # an SSE answer is left open
                assert answer.status_code == 200, (cursor, answer.status_code, answer.read()[:300])
                if live == "long-poll":
                    assert answer.headers["Stream-Cursor"].isascii() and answer.headers["Stream-Cursor"].isdigit()


@pytest.mark.parametrize("name", ["what%3Fnext", "hash%23tag", "per%25cent", "sp%20ace", "caf%C3%A9", "semi%3Bcolon"])
def test_the_location_of_a_created_stream_names_that_stream(open_durable_server: str, name: str) -> None:
    """Item 9: the Location after a PUT is the stream's URL, escaped: a GET of it reaches it."""
    base = f"http://{open_durable_server}"
    with httpx.Client(timeout=20) as client:
        created = client.put(f"{base}{ENDPOINT}loc/{name}", headers=TEXT, content=f"in {name}")
        assert created.status_code == 201, created.text
        location = created.headers["Location"]
        assert "?" not in location and "#" not in location, location
        assert unquote(httpx.URL(location).raw_path.decode()) == f"{ENDPOINT}loc/{unquote(name)}", location
        assert client.get(location).text == f"in {name}"


GADGET_PAGE = """<!doctype html>
<link rel="stylesheet" href="{endpoint}gadget/css">
<script src="{endpoint}gadget/js"></script>
<script src="/pgstreams/streams/{stream_id}/events?format=html"></script>
<p id="styled">styled?</p>
"""


@pytest.fixture(scope="module")
def sniffing_server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo under daphne, its Durable Streams endpoint open to anyone, in a project whose
    SecurityMiddleware does not send ``nosniff`` (SECURE_CONTENT_TYPE_NOSNIFF = False)."""
    folder = tmp_path_factory.mktemp("sniffing")
    (folder / "sniffing_settings.py").write_text(
        "from demo_project.settings import *  # noqa: F403\nSECURE_CONTENT_TYPE_NOSNIFF = False\n"
    )
    port = free_port()
    env = {"DJANGO_SETTINGS_MODULE": "sniffing_settings", "PYTHONPATH": f"{folder}:{ROOT}", **OPEN_DURABLE}
    with serving(server_command("daphne", "demo_project.asgi:application", port), port, env=env) as host:
        yield host


def test_a_stream_is_never_a_script_or_a_style_sheet_of_a_page_of_the_site(sniffing_server: str, page) -> None:
    """Suspicion: a writer makes a ``text/javascript`` (or ``text/css``) stream, or a text stream
    whose SSE events read as JavaScript, and a page of the site with an HTML injection but
    ``script-src 'self'`` loads it as its own script or style sheet. In Chromium, with a page whose
    CSP allows the site's own scripts only, in a project that does not send ``nosniff`` itself:
    nothing of the streams runs or styles, while fetch() (what the protocol's clients send) still
    reads them."""
    base = f"http://{sniffing_server}"
    script, style = {"Content-Type": "text/javascript"}, {"Content-Type": "text/css"}
    assert send("PUT", f"{base}{ENDPOINT}gadget/js", headers=script, content="window.pwned = 'js'").status_code == 201
    red = "#styled { color: rgb(255, 0, 0) }"
    assert send("PUT", f"{base}{ENDPOINT}gadget/css", headers=style, content=red).status_code == 201
    # A text stream whose SSE answer (retry:, id: and data: lines) is a valid script, labels and
    # statements, with no end event: the answer ends after its bytes while the stream is open.
    assert send("PUT", f"{base}{ENDPOINT}gadget/sse", headers=TEXT, content="window.pwned_sse=1").status_code == 201
    for _ in range(18):
        assert send("POST", f"{base}{ENDPOINT}gadget/sse", headers=TEXT, content=";" * 65536).status_code == 204
    stream_id = in_thread(lambda: Stream.objects.get(path="gadget/sse").id)
    html = GADGET_PAGE.format(endpoint=ENDPOINT, stream_id=stream_id)
    headers = {"Content-Type": "text/html", "Content-Security-Policy": "script-src 'self'"}
    page.route(f"{base}/gadget-page", lambda route: route.fulfill(status=200, body=html, headers=headers))
    page.goto(f"{base}/gadget-page", wait_until="load")
    ran = page.evaluate("[window.pwned || null, window.pwned_sse || null]")
    color = page.evaluate("getComputedStyle(document.getElementById('styled')).color")
    fetched = page.evaluate(f"fetch('{ENDPOINT}gadget/js').then(r => r.text())")
    assert (ran, color) == ([None, None], "rgb(0, 0, 0)")
    assert fetched == "window.pwned = 'js'"


def django_accepts_origin(origin: str, headers: dict[str, str], secure: bool) -> bool:
    """Whether Django's own CsrfViewMiddleware accepts a POST with this Origin and these headers
    (Host, X-Forwarded-*), over https or not: its CSRF token is right, so only the Origin decides."""
    request = RequestFactory().post("/", secure=secure, HTTP_ORIGIN=origin, HTTP_X_CSRFTOKEN="a" * 32)
    request.COOKIES[settings.CSRF_COOKIE_NAME] = "a" * 32
    for name, value in headers.items():
        request.META["HTTP_" + name.upper().replace("-", "_")] = value
    return CsrfViewMiddleware(lambda r: HttpResponse()).process_view(request, lambda r: None, (), {}) is None


def validator_accepts_origin(origin: str, headers: dict[str, str], secure: bool) -> bool:
    """Whether CsrfOriginValidator lets a WebSocket handshake with these headers through."""
    scope = {
        "type": "websocket",
        "scheme": "wss" if secure else "ws",
        "server": ("127.0.0.1", 8000),
        "headers": [(b"origin", origin.encode("latin1"))]
        + [(name.lower().encode(), value.encode("latin1")) for name, value in headers.items()],
    }
    reached, sent = [], []

    async def application(scope, receive, send) -> None:
        reached.append(scope)

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(CsrfOriginValidator(application)(scope, receive, send))
    assert bool(reached) != bool(sent) and sent in ([], [{"type": "websocket.close"}])
    return bool(reached)


HOSTS = ["127.0.0.1", "localhost", "example.com", "api.example.com", "EXAMPLE.com", "evil.example", "[::1]"]
HOST_PORTS = st.builds(
    lambda host, port: host + (f":{port}" if port else ""),
    st.sampled_from(HOSTS),
    st.sampled_from([None, 80, 443, 4444, 8000]),
)
ORIGINS = st.one_of(
    st.builds(lambda scheme, host: f"{scheme}://{host}", st.sampled_from(["http", "https", "ws", "HTTP"]), HOST_PORTS),
    st.sampled_from(["null", "", "http://", "http://[::1", "https://*.example.com", "http://example.com/"]),
    st.text(st.characters(max_codepoint=255), max_size=30),
)
SETTINGS = st.fixed_dictionaries(
    {
        "ALLOWED_HOSTS": st.lists(
            st.sampled_from(["127.0.0.1", "localhost", ".example.com", "example.com", "*"]), max_size=3
        ),
        "CSRF_TRUSTED_ORIGINS": st.lists(
            st.sampled_from(
                ["https://*.example.com", "http://localhost:4444", "https://example.com", "http://*.example.com:8000"]
            ),
            max_size=3,
        ),
        "SECURE_PROXY_SSL_HEADER": st.sampled_from([None, ("HTTP_X_FORWARDED_PROTO", "https")]),
        "USE_X_FORWARDED_HOST": st.booleans(),
        "DEBUG": st.booleans(),
    }
)
FORWARDED = st.dictionaries(
    st.sampled_from(["X-Forwarded-Proto", "X-Forwarded-Host"]),
    st.sampled_from(["https", "http", "example.com", "evil.example:4444"]),
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(
    origin=ORIGINS,
    host=st.one_of(HOST_PORTS, st.text(st.characters(max_codepoint=255), max_size=20)),
    secure=st.booleans(),
    forwarded=FORWARDED,
    changed=SETTINGS,
)
def test_the_websocket_origin_check_agrees_with_djangos_csrf_check(
    origin: str, host: str, secure: bool, forwarded: dict[str, str], changed: dict
) -> None:
    """Item 10: the same (Origin, Host, scheme, proxy headers) under the same settings, to Django's
    CsrfViewMiddleware and to the validator: the same answer."""
    headers = {"Host": host, **forwarded}
    with override_settings(**changed):
        assert validator_accepts_origin(origin, headers, secure) == django_accepts_origin(origin, headers, secure)


@pytest.mark.parametrize(
    ("origin", "secure", "accepted"),
    [
        ("http://127.0.0.1:8000", False, True),
        ("http://127.0.0.1:4444", False, False),  # another port of the host: AllowedHostsOriginValidator took it
        ("https://127.0.0.1:8000", False, False),  # another scheme
        ("https://127.0.0.1:8000", True, True),
        ("http://127.0.0.1:8000", True, False),
        ("http://localhost:8000", False, False),  # another name of the host
        ("https://api.example.com", False, True),  # CSRF_TRUSTED_ORIGINS, a subdomain of its wildcard
        ("http://api.example.com", False, False),  # ... of another scheme
        ("http://localhost:4444", False, True),  # CSRF_TRUSTED_ORIGINS exactly
    ],
)
def test_the_websocket_origin_check_takes_scheme_host_and_port(origin: str, secure: bool, accepted: bool) -> None:
    headers = {"Host": "127.0.0.1:8000"}
    with override_settings(CSRF_TRUSTED_ORIGINS=["https://*.example.com", "http://localhost:4444"]):
        assert (
            validator_accepts_origin(origin, headers, secure)
            == django_accepts_origin(origin, headers, secure)
            == accepted
        )


# Every parameter of the endpoints, fed arbitrary text: a clear 4xx (or a success), never a 500 or
# a traceback. Requests go to the demo's HTTP application (DurableStreamsFirst around Django) as
# an ASGI server hands them over: a path of decoded text, a query string of bytes (percent-encoded
# UTF-8, lone surrogates as their bytes), headers of bytes (Latin-1, or UTF-8 as a client sent it).
# Any text: NUL and the other controls, Unicode digits and spaces, lone surrogates (drawn on
# purpose: characters() draws one only now and then).
SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
ANYTHING = st.text(st.one_of(st.characters(), SURROGATES, st.sampled_from("\x00\r\n ²٣\u3000")))
LATIN1 = st.text(st.characters(max_codepoint=255))
NUMBERISH = st.one_of(
    LATIN1,
    ANYTHING,
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["²", "١٢", "٣", "0x10", "1e3", " 7", "7 ", "+7", "-1", "00", "9" * 5000, "", "\x00"]),
)
PATHS = st.one_of(
    # No lone surrogate with a line break: the route's <path:> does not match a line break, and a
    # URL the URLconf does not match is Django's page_not_found, whose quote() fails on a
    # surrogate (a 500 of Django's for any URL; no server hands an application one).
    st.text(st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from("\x00\r\n ²٣\u3000"))),
    # Lone surrogates without control characters (refused first): they reach the endpoint.
    st.text(st.one_of(st.characters(exclude_categories=["Cc", "Cs"]), SURROGATES), min_size=1),
    st.sampled_from(["a/../b", "./a", "a//b", "__ds/x", "a\\b", "%2e%2e", "a?b", "a#b", "x" * 600]),
)
LIVE_OFFSETS = st.one_of(
    NUMBERISH, st.sampled_from(["-1", "now", "0000000000000000_0000000000000000", "0000000000000099_0000000000000000"])
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)
BODIES = st.one_of(
    st.binary(max_size=200),
    ANYTHING.map(lambda text: text.encode("utf-8", "surrogatepass")),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    JSON_VALUES.map(lambda value: json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.sampled_from([b"[" * 100_000, b"1" * 5000, b"NaN", b"[]", b"[1,]", b'"\\u0000"', b"\x00"]),
)
QUIET = hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPEN_RULE = {"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything", "LONG_POLL_TIMEOUT": 1.0}


def query(**values: str | list[str]) -> bytes:
    """A query string: each value percent-encoded as UTF-8 (a surrogate as its bytes)."""
    parts = []
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            parts.append(f"{name}={quote(item, safe='', errors='surrogatepass')}")
    return "&".join(parts).encode()


class Errors(logging.Handler):
    """Records of ERROR and above, from Django's request log (a 500's traceback) and pgstreams'."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def no_errors_logged() -> Iterator[None]:
    errors = Errors()
    loggers = [logging.getLogger(name) for name in ("django.request", "django.server", "pgstreams")]
    for logger in loggers:
        logger.addHandler(errors)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(errors)
    assert not errors.records, [record.getMessage() for record in errors.records]


_applications: dict[str, object] = {}


def application() -> object:
    """The demo's HTTP application (as its asgi.py mounts it), made once."""
    if "http" not in _applications:
        from django.core.asgi import get_asgi_application

        from pgstreams.durable.asgi import DurableStreamsFirst

        _applications["http"] = DurableStreamsFirst(get_asgi_application())
    return _applications["http"]


def header_bytes(value: str) -> bytes:
    """A header's bytes: Latin-1 where it can be (Django reads headers so), else UTF-8 as sent."""
    try:
        return value.encode("latin1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


async def call(
    method: str, path: str, *, query_string: bytes = b"", headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, bytes]:
    """One request to the application; its status and body. A 4xx must say what is wrong."""
    raw = [(b"host", b"127.0.0.1")]
    given = {name.lower(): value for name, value in (headers or {}).items()}
    if "content-length" not in given:
        given["content-length"] = str(len(body))
    raw += [(name.encode(), header_bytes(value)) for name, value in given.items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": quote(path, errors="surrogatepass").encode(),
        "query_string": query_string,
        "root_path": "",
        "headers": raw,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict] = []
    requested = asyncio.Event()

    async def receive() -> dict:
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: every answer asked for here ends by itself
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    with no_errors_logged():
        await asyncio.wait_for(application()(scope, receive, send), 30)
    status = sent[0]["status"]
    content = b"".join(message.get("body", b"") for message in sent[1:])
    assert status < 500, (method, path, query_string, headers, status, content[:300])
    assert b"Traceback" not in content
    if status >= 400:
        assert content.strip(), f"{status} without a message: {method} {path!r} {query_string!r} {headers}"
    return status, content


async def stream_at(path: str, content_type: str = "text/plain", *, closed: bool = False, chunks: int = 2) -> Stream:
    """The stream at ``path``, made once, with ``chunks`` chunks."""
    stream = await Stream.objects.filter(path=path).afirst()
    if stream is None:
        headers = {"Content-Type": content_type, **({"Stream-Closed": "true"} if closed else {})}
        body = b"[" + b",".join([b'"x"'] * chunks) + b"]" if content_type == "application/json" else b"x" * chunks
        with override_settings(PGSTREAMS=OPEN_RULE):
            assert (await call("PUT", ENDPOINT + path, headers=headers, body=body))[0] == 201
        stream = await Stream.objects.aget(path=path)
    return stream


@QUIET
@given(
    offset=st.lists(LIVE_OFFSETS, max_size=2),
    live=st.one_of(st.none(), st.sampled_from(["long-poll", "sse"]), ANYTHING),
    cursor=ANYTHING,
)
async def test_any_offset_live_and_cursor_of_a_read_answers_without_a_server_error(
    offset: list[str], live: str | None, cursor: str
) -> None:
    closed = await stream_at("hostile/read/closed", closed=True)
    values: dict[str, str | list[str]] = {"offset": offset, "cursor": cursor}
    if live is not None:
        values["live"] = live
    with override_settings(PGSTREAMS=OPEN_RULE):
        await call("GET", f"{ENDPOINT}{closed.path}", query_string=query(**values))
        await stream_at("hostile/read/open")  # data at -1: a long-poll answers at once, with its cursor
        status, _ = await call(
            "GET", f"{ENDPOINT}hostile/read/open", query_string=query(offset="-1", live="long-poll", cursor=cursor)
        )
        assert status == 200
        await call("GET", f"{ENDPOINT}{closed.path}", headers={"If-None-Match": cursor})


@QUIET
@given(path=PATHS, method=st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH"]))
async def test_any_stream_path_answers_without_a_server_error(path: str, method: str) -> None:
    with override_settings(PGSTREAMS=OPEN_RULE):
        await call(method, ENDPOINT + path, headers=TEXT, body=b"x" if method == "POST" else b"")


PUT_HEADERS = [
    "Stream-TTL",
    "Stream-Expires-At",
    "Content-Type",
    "Stream-Closed",
    "Stream-Forked-From",
    "Stream-Fork-Offset",
    "Stream-Fork-Sub-Offset",
    "Content-Length",
]


@QUIET
@given(
    headers=st.dictionaries(st.sampled_from(PUT_HEADERS), NUMBERISH, max_size=4), body=BODIES, n=st.integers(0, 10**6)
)
async def test_any_create_header_and_body_answers_without_a_server_error(
    headers: dict[str, str], body: bytes, n: int
) -> None:
    await stream_at("hostile/source")
    headers.setdefault("Content-Type", "application/json" if n % 2 else "text/plain")
    if "Stream-Forked-From" in headers and n % 3 == 0:
        headers["Stream-Forked-From"] = "hostile/source"
    with override_settings(PGSTREAMS=OPEN_RULE):
        await call("PUT", f"{ENDPOINT}hostile/made/{n}", headers=headers, body=body)


POST_HEADERS = [
    "Producer-Id",
    "Producer-Epoch",
    "Producer-Seq",
    "Stream-Seq",
    "Stream-Closed",
    "Content-Type",
    "Content-Length",
]


@QUIET
@given(
    headers=st.dictionaries(st.sampled_from(POST_HEADERS), NUMBERISH, max_size=5),
    body=BODIES,
    kind=st.sampled_from(["text/plain", "application/json", "application/octet-stream"]),
    producer=st.booleans(),
)
async def test_any_append_header_and_body_answers_without_a_server_error(
    headers: dict[str, str], body: bytes, kind: str, producer: bool
) -> None:
    stream = await stream_at(f"hostile/append/{kind}", kind, chunks=0)
    headers.setdefault("Content-Type", kind)
    if producer:  # all three, so that the values themselves are judged
        for name in ("Producer-Id", "Producer-Epoch", "Producer-Seq"):
            headers.setdefault(name, "0")
    with override_settings(PGSTREAMS=OPEN_RULE):
        await call("POST", ENDPOINT + stream.path, headers=headers, body=body)
        if headers.get("Stream-Closed", "").strip().lower() == "true":
            await Stream.objects.filter(pk=stream.pk).adelete()  # the next example appends to a new one


@QUIET
@given(
    start=st.one_of(st.none(), st.lists(NUMBERISH, max_size=2)),
    last_event_id=st.one_of(st.none(), NUMBERISH),
    format=st.lists(ANYTHING, max_size=2),
    # No lone surrogate here: the URLconf matches no such id (see PATHS). characters() draws one
    # now and then unless told not to.
    stream_id=st.one_of(st.none(), st.text(st.characters(exclude_categories=["Cs"]), min_size=1)),
)
async def test_any_parameter_of_the_sse_view_answers_without_a_server_error(
    start: list[str] | None, last_event_id: str | None, format: list[str], stream_id: str | None
) -> None:
    closed = await stream_at("hostile/sse", closed=True)
    values: dict[str, str | list[str]] = {"format": format}
    if start is not None:
        values["from"] = start
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    target = str(closed.id) if stream_id is None else stream_id.replace("/", "")
    await call("GET", f"/pgstreams/streams/{target}/events", query_string=query(**values), headers=headers)


@QUIET
@given(start=st.lists(NUMBERISH, max_size=2))
async def test_any_from_of_a_websocket_closes_with_4400_or_reads(start: list[str]) -> None:
    from channels.testing import WebsocketCommunicator

    from demo_project.asgi import application as demo

    closed = await stream_at("hostile/ws", closed=True)
    path = f"/ws/pgstreams/{closed.id}/?" + query(**{"from": start}).decode()
    with no_errors_logged():
        communicator = WebsocketCommunicator(
            demo, path, headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
        )
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        try:
            while True:  # bounded: the server closes after its end or error frame
                message = await communicator.receive_output(timeout=10)
                if message["type"] == "websocket.close":
                    assert message.get("code", 1000) in (1000, 4400), message
                    break
                if message["type"] == "websocket.send":
                    frame = json.loads(message["text"])
                    if frame["type"] == "chunks":
                        await communicator.send_json_to({"type": "ack", "frame": frame["frame"]})
                    elif frame["type"] == "error":
                        assert frame["code"] == 4400 and frame["message"]
        finally:
            await communicator.disconnect()
