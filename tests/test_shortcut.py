"""The shortcut (``DurableStreamsFirst``) answers as Django's own handler does: the same requests
sent both ways, to one project mounted both ways, answer with the same status, body and headers
(``Date`` aside), over sessions and users (anonymous, signed in, after a key rotation, expired,
modified by the rule, kept by other engines, holding the CSRF secret or the messages), settings
and middleware (a foreign host, the HTTPS redirect, LoginRequiredMiddleware, CSRF, a script
prefix, Django 6's CSP), each Durable Streams verb and the SSE view, and the database's
connections cut between two requests; then requests made up by hypothesis.

Each side writes to streams of its own (``{side}`` in a path) and has its own session, so that
both meet the same state; what only names the side, or is random by design (a cookie's value, a
cursor's interval, a CSP nonce, a per-side stream's ETag), is compared by its presence."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.cookies import SimpleCookie
from typing import Any

import django
import httpx
import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.core.asgi import get_asgi_application
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_finished, request_started
from django.db import connection, connections
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import include, register_converter
from django.urls import path as route
from django.utils import timezone, translation
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import pgstreams
from pgstreams.durable import cycle
from pgstreams.durable.asgi import DurableStreamsFirst
from pgstreams.models import Stream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("as_in_a_server")]

TEXT = {"Content-Type": "text/plain"}
ENDPOINT = "/pgstreams/v1/stream/"


def signed_in(request: Any, action: str, path: str, stream: Any) -> bool:
    """A rule: anyone signed in may do anything."""
    return request.user.is_authenticated


def counting(request: Any, action: str, path: str, stream: Any) -> bool:
    """A rule that writes to the session and adds a message each time it is asked, then allows."""
    request.session["pgstreams_asked"] = request.session.get("pgstreams_asked", 0) + 1
    messages.info(request, f"asked to {action} {path}")
    return True


def messaging(request: Any, action: str, path: str, stream: Any) -> bool:
    """A rule that adds a message, and touches the session no other way, then allows."""
    messages.info(request, f"asked to {action} {path}")
    return True


def rule(name: str) -> dict[str, Any]:
    return {"DURABLE_AUTHORIZE": f"tests.test_shortcut.{name}"}


@pytest.fixture
def as_in_a_server() -> Iterator[None]:
    """The event loop's thread (this one) with no connection of Django's open, to any database
    (a session's fixture may have left one), as in a server (Django allows no query there):
    where one is open, the shortcut sends the request signals by Django's hop
    (``cycle.sent_here``), and the tests would meet only that way."""
    connections.close_all()
    for wrapper in list(cycle._opened.wrappers):  # aliases a session's fixture took out of settings, too
        if wrapper._thread_ident == threading.get_ident():
            wrapper.close()
    yield


class Toggle:
    """A project's converter whose answer does not follow from the path alone."""

    regex = "[^/]+"
    matches = False

    def to_python(self, value: str) -> str:
        if not Toggle.matches:
            raise ValueError(value)
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(Toggle, "pgstreams-test-toggle")
urlpatterns = [  # a URLconf whose first pattern takes an endpoint's path when Toggle.matches
    route("pgstreams/v1/stream/toggled/<pgstreams-test-toggle:name>", lambda request, name: HttpResponse("toggled")),
    route("pgstreams/", include("pgstreams.urls")),
]


class ClosingCache(LocMemCache):
    """A cache whose close does something (as a connection's may, which may block)."""

    closed_on: list[str] = []

    def close(self, **kwargs: Any) -> None:
        ClosingCache.closed_on.append(threading.current_thread().name)


class Hops(ThreadPoolExecutor):
    """``sync_to_async``'s one thread, counting the calls it is given."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="hops")
        self.count = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return super().submit(*args, **kwargs)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hops]:
    """``sync_to_async``'s one thread replaced by a counting one for the test, each of them with
    no connection open when it is set aside (none left for the request signals to close)."""
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(10)
    executor = Hops()
    monkeypatch.setattr(SyncToAsync, "single_thread_executor", executor)
    yield executor
    executor.submit(connections.close_all).result(10)
    executor.shutdown()


def no_connection_open() -> None:
    """Hold that no Django connection outside pgstreams' threads is open (where one is, the
    request signals go by Django's hop, as they should), saying whose."""
    threads = {thread.ident: thread.name for thread in threading.enumerate()}
    whose = [threads.get(wrapper._thread_ident, "a thread that ended") for wrapper in cycle._opened.wrappers]
    assert cycle._opened.idle(), f"Django connections open on: {whose}"


@dataclasses.dataclass
class Side:
    """One way to the project, with the cookies its client holds."""

    name: str
    token: str  # what ``{side}`` stands for in its paths: the same length both ways
    app: Any
    scheme: str
    root_path: str
    cookies: dict[str, str] = dataclasses.field(default_factory=dict)

    async def send(self, method: str, path: str, headers: dict[str, str], body: bytes) -> httpx.Response:
        headers = dict(headers)
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        transport = httpx.ASGITransport(app=self.app, root_path=self.root_path)
        async with httpx.AsyncClient(transport=transport, base_url=f"{self.scheme}://127.0.0.1") as client:
            answer = await client.request(method, path.format(side=self.token), headers=headers, content=body)
        for header in answer.headers.get_list("set-cookie"):
            for name, morsel in SimpleCookie(header).items():
                if morsel["max-age"] == "0":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return answer


class Project:
    """The project mounted both ways, made under the settings of the moment: Django's handler,
    and ``DurableStreamsFirst`` around it; its clients' cookies those of ``cookies_of``'s."""

    def __init__(self, scheme: str = "http", cookies_of: Project | None = None, root_path: str = "") -> None:
        django_app = get_asgi_application()
        self.first = DurableStreamsFirst(django_app)
        self.sides = {
            "django": Side("django", "side-0", django_app, scheme, root_path),
            "shortcut": Side("shortcut", "side-1", self.first, scheme, root_path),
        }
        for name, side in (cookies_of.sides if cookies_of else {}).items():
            self.sides[name].cookies = side.cookies

    async def agree(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | str = b""
    ) -> httpx.Response:
        """Send the request both ways (Django's first), hold that they answer alike, and return
        the shortcut's answer."""
        content = body.encode() if isinstance(body, str) else body
        answers = {name: await side.send(method, path, headers or {}, content) for name, side in self.sides.items()}
        handler = self.first._handler
        assert handler is not None and handler.takes_over, "the shortcut handed the request to Django"
        routed = path.split("?")[0].removeprefix(self.sides["shortcut"].root_path)
        assert handler.routes(routed, method), f"not the shortcut's: {path}"
        seen = {name: shape(answer, self.sides[name].token, "{side}" in path) for name, answer in answers.items()}
        if seen["shortcut"] != seen["django"]:
            lines = {name: [str(seen[name][0]), *map(str, seen[name][1]), seen[name][2]] for name in seen}
            difference = "\n".join(difflib.unified_diff(lines["django"], lines["shortcut"], "django", "shortcut"))
            raise AssertionError(f"{method} {path} {headers or {}} answers differently:\n{difference}")
        return answers["shortcut"]

    async def every_verb(
        self, prefix: str, csrf: dict[str, str] | None = None, extra: dict[str, str] | None = None
    ) -> None:
        """Each Durable Streams verb, both ways, on streams of each side's own under ``prefix``,
        with ``csrf`` on the writes and ``extra`` on every request. No live read: a stream the
        rule or CSRF left open would hold it a minute."""
        own = f"{self.sides['shortcut'].root_path}{ENDPOINT}{prefix}/{{side}}"
        write = {**TEXT, **(csrf or {})}
        for method, path, headers, body in [
            ("PUT", f"{own}/a", write, ""),
            ("PUT", f"{own}/a", write, ""),  # again: the same stream exists
            ("POST", f"{own}/a", write, "one"),
            ("GET", f"{own}/a?offset=-1", {}, ""),
            ("HEAD", f"{own}/a", {}, ""),
            ("OPTIONS", f"{own}/a", {"Origin": "http://127.0.0.1", "Access-Control-Request-Method": "POST"}, ""),
            ("PUT", f"{own}/fork", {**write, "Stream-Forked-From": f"{own}/a"}, ""),
            ("POST", f"{own}/a", {**write, "Stream-Closed": "true"}, "two"),
            ("GET", f"{own}/a?offset=-1", {}, ""),
            ("DELETE", f"{own}/fork", csrf or {}, ""),
            ("GET", f"{own}/missing?offset=-1", {}, ""),
        ]:
            await self.agree(method, path, {**headers, **(extra or {})}, body)


def shape(answer: httpx.Response, token: str, own_stream: bool) -> tuple[int, list[tuple[str, str]], str]:
    """An answer as the comparison sees it: its side's name as ``<side>``, and where a value is
    random by design (cookies, cursors, CSP nonces, a per-side stream's ETag), whether it is there."""

    def same(text: str) -> str:
        text = text.replace(token, "<side>")
        text = re.sub(r'"streamCursor":"\d+"', '"streamCursor":"<n>"', text)
        return re.sub(r"nonce([=-])[\"']?[\w-]+", r"nonce\1<nonce>", text)

    headers = []
    for name, value in answer.headers.multi_items():
        name = name.lower()
        if name == "date":
            continue
        if name == "set-cookie":
            value = cookie_shape(value)
        elif name == "stream-cursor" or (name == "etag" and own_stream):
            value = "<set>"
        headers.append((name, same(value)))
    return answer.status_code, headers, same(answer.content.decode("utf-8", "replace"))


def cookie_shape(header: str) -> str:
    """A Set-Cookie header with its value and its expiry date as whether they are set."""
    ((name, morsel),) = SimpleCookie(header).items()
    attributes = sorted((key, "<date>" if key == "expires" else value) for key, value in morsel.items() if value)
    return f"{name}={'<value>' if morsel.value else ''}; {attributes}"


async def shared_streams(owner: Any = None) -> tuple[str, str]:
    """A closed stream both sides read, and its SSE view's URL: (its endpoint path, the view's URL)."""
    s = await pgstreams.acreate_stream(path=f"shared/{owner.pk if owner else 'anyone'}", owner=owner)
    await pgstreams.awrite_many(s.id, ["first", "<second>\nline"])
    await pgstreams.aclose(s.id)
    return f"{ENDPOINT}{s.path}", f"/pgstreams/streams/{s.id}/events"


async def reads(project: Project, durable: str, events: str) -> None:
    for path, headers in [
        (f"{durable}?offset=-1", {}),
        (f"{durable}?offset=-1&live=sse", {}),
        (f"{durable}?offset=1&live=long-poll", {}),
        (events, {}),
        (f"{events}?from=1", {}),
        (events, {"Last-Event-ID": "0"}),
        (f"{events}?from=x", {}),
        (f"{events}?format=html&from=1", {}),
        (f"{events}?format=xml", {}),
    ]:
        await project.agree("GET", path, headers)


def user(name: str) -> Any:
    return get_user_model().objects.create_user(name, password="pw")


async def sign_in(project: Project, someone: Any) -> None:
    """Give each side a session of its own, signed in as ``someone``."""
    for side in project.sides.values():
        client = Client()
        await sync_to_async(client.force_login)(someone)
        side.cookies[settings.SESSION_COOKIE_NAME] = client.cookies[settings.SESSION_COOKIE_NAME].value


async def csrf_token(project: Project) -> dict[str, str]:
    """A CSRF cookie for each side and the header that goes with it."""
    for side in project.sides.values():
        side.cookies[settings.CSRF_COOKIE_NAME] = "a" * 32
    return {"X-CSRFToken": "a" * 32}


async def test_anonymous_requests_of_every_kind_answer_alike() -> None:
    durable, events = await shared_streams()
    rules = (
        "pgstreams.auth.default_durable_authorize",
        "tests.test_shortcut.signed_in",
        "tests.test_shortcut.counting",
    )
    for k, name in enumerate(rules):  # the last one starts a session
        with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": name}):
            project = Project()
            await project.every_verb(f"anonymous/{k}")
            await reads(project, durable, events)
    csrf = await csrf_token(project)
    with override_settings(PGSTREAMS=rule("counting")):
        project = Project(cookies_of=project)
        await project.every_verb("anonymous/counting/token", csrf)


async def test_signed_in_requests_answer_alike_with_csrf_missing_and_present() -> None:
    someone = await sync_to_async(user)("signed-in")
    durable, events = await shared_streams(owner=someone)
    with override_settings(PGSTREAMS=rule("signed_in")):
        project = Project()
        await sign_in(project, someone)
        await project.every_verb("signed-in/no-token")  # writes: 403, CSRF
        csrf = await csrf_token(project)
        await project.every_verb("signed-in/token", csrf)
        await reads(project, durable, events)
        read = await project.agree("GET", f"{durable}?offset=-1")
        assert read.status_code == 200 and "Cookie" in read.headers["Vary"]
        for side in project.sides.values():  # a cookie that is not a CSRF secret: a new one is set
            side.cookies[settings.CSRF_COOKIE_NAME] = "not a secret"
        await project.agree("GET", f"{durable}?offset=-1")
        await project.agree("POST", f"{ENDPOINT}signed-in/token/{{side}}/b", TEXT, "x")


async def test_a_session_cycled_after_a_key_rotation_keeps_its_user_signed_in_both_ways() -> None:
    someone = await sync_to_async(user)("rotated")
    durable, events = await shared_streams(owner=someone)
    signed = Project()
    await sign_in(signed, someone)
    before = dict(signed.sides["shortcut"].cookies)
    with override_settings(
        PGSTREAMS=rule("signed_in"), SECRET_KEY="a new key, " * 5, SECRET_KEY_FALLBACKS=[settings.SECRET_KEY]
    ):
        project = Project(cookies_of=signed)
        first = await project.agree("GET", f"{durable}?offset=-1")
        assert first.status_code == 200 and settings.SESSION_COOKIE_NAME in first.headers["Set-Cookie"]
        assert project.sides["shortcut"].cookies != before  # the session was cycled, and its new key sent
        again = await project.agree("GET", f"{durable}?offset=-1")
        assert again.status_code == 200 and "Set-Cookie" not in again.headers
        await reads(project, durable, events)
        csrf = await csrf_token(project)
        await project.every_verb("rotated", csrf)
    for side in project.sides.values():  # the other way round: a new session, then the SSE view first
        side.cookies.pop(settings.SESSION_COOKIE_NAME)
    await sign_in(project, someone)
    with override_settings(SECRET_KEY="a newer key, " * 5, SECRET_KEY_FALLBACKS=[settings.SECRET_KEY]):
        project = Project(cookies_of=project)
        assert (await project.agree("GET", events)).status_code == 200
        assert (await project.agree("GET", events)).status_code == 200


async def test_an_expired_session_answers_alike() -> None:
    someone = await sync_to_async(user)("expired")
    durable, events = await shared_streams(owner=someone)
    with override_settings(PGSTREAMS=rule("signed_in")):
        project = Project()
        await sign_in(project, someone)
        keys = [side.cookies[settings.SESSION_COOKIE_NAME] for side in project.sides.values()]
        past = timezone.now() - timezone.timedelta(days=1)
        await Session.objects.filter(session_key__in=keys).aupdate(expire_date=past)
        csrf = await csrf_token(project)
        await reads(project, durable, events)
        await project.every_verb("expired", csrf)


async def test_a_session_the_rule_modifies_is_saved_and_sent_alike() -> None:
    someone = await sync_to_async(user)("counted")
    with override_settings(PGSTREAMS=rule("counting")):
        project = Project()
        await sign_in(project, someone)
        csrf = await csrf_token(project)
        await project.every_verb("counted", csrf)
    keys = [side.cookies[settings.SESSION_COOKIE_NAME] for side in project.sides.values()]
    counts = [(await Session.objects.aget(session_key=key)).get_decoded()["pgstreams_asked"] for key in keys]
    assert counts[0] == counts[1] > 0


@pytest.mark.parametrize(
    ("changed", "asks"),
    [
        ({"CSRF_USE_SESSIONS": True}, "counting"),
        ({"SESSION_SAVE_EVERY_REQUEST": True}, "counting"),
        ({"MESSAGE_STORAGE": "django.contrib.messages.storage.session.SessionStorage"}, "messaging"),
        ({"SESSION_ENGINE": "django.contrib.sessions.backends.cached_db"}, "counting"),
        ({"SESSION_ENGINE": "django.contrib.sessions.backends.signed_cookies"}, "counting"),
    ],
    ids=lambda value: ",".join(value) if isinstance(value, dict) else value,
)
async def test_sessions_kept_otherwise_answer_alike(changed: dict[str, Any], asks: str) -> None:
    """Where the middleware's other hooks reach the session (and so the database): the CSRF
    secret in it, a save on every request, messages stored in it (by a rule that touches the
    session no other way), other session engines."""
    someone = await sync_to_async(user)(re.sub(r"[^\w.@+-]+", "-", f"kept {changed}")[:150])
    durable, events = await shared_streams(owner=someone)
    with override_settings(PGSTREAMS=rule(asks), **changed):
        project = Project()
        await sign_in(project, someone)
        csrf = await csrf_token(project)
        await reads(project, durable, events)
        await project.every_verb(f"kept/{next(iter(changed.values()))}", csrf)


async def test_a_foreign_host_and_the_https_redirect_answer_alike() -> None:
    durable, events = await shared_streams()
    foreign = {"Host": "attacker.example"}
    minimal = ["django.middleware.security.SecurityMiddleware"]
    for middleware in (settings.MIDDLEWARE, minimal):  # without CommonMiddleware, only what asks the host
        with override_settings(PGSTREAMS=rule("counting"), MIDDLEWARE=middleware):
            project = Project()
            await project.every_verb(f"foreign/{len(middleware)}", extra=foreign)
            for path in (f"{durable}?offset=-1", events):
                await project.agree("GET", path, foreign)
    for scheme in ("http", "https"):
        with override_settings(SECURE_SSL_REDIRECT=True, SECURE_HSTS_SECONDS=3600, SECURE_HSTS_PRELOAD=True):
            project = Project(scheme)
            await reads(project, durable, events)
            await project.agree("PUT", f"{ENDPOINT}redirected/{{side}}", TEXT)


async def test_a_project_under_a_script_prefix_answers_alike() -> None:
    durable, events = await shared_streams()
    with override_settings(PGSTREAMS=rule("counting")):
        project = Project(root_path="/app")
        await reads(project, f"/app{durable}", f"/app{events}")
        csrf = await csrf_token(project)
        await project.every_verb("prefixed", csrf)  # a fork names its source with the prefix


async def test_login_required_middleware_answers_alike() -> None:
    someone = await sync_to_async(user)("required")
    durable, events = await shared_streams(owner=someone)
    with override_settings(
        PGSTREAMS=rule("signed_in"),
        MIDDLEWARE=[*settings.MIDDLEWARE, "django.contrib.auth.middleware.LoginRequiredMiddleware"],
    ):
        project = Project()
        await reads(project, durable, events)  # anonymous: to the login page
        await sign_in(project, someone)
        await reads(project, durable, events)
        csrf = await csrf_token(project)
        await project.every_verb("required", csrf)


async def test_a_project_without_sessions_answers_alike() -> None:
    durable, events = await shared_streams()
    sessions = ("django.contrib.sessions", "django.contrib.messages")
    without = [app for app in settings.INSTALLED_APPS if app not in sessions]
    middleware = ["django.middleware.security.SecurityMiddleware", "django.middleware.common.CommonMiddleware"]
    with override_settings(INSTALLED_APPS=without, MIDDLEWARE=middleware, PGSTREAMS=rule("counting")):
        project = Project()
        await reads(project, durable, events)


@pytest.mark.skipif(django.VERSION < (6, 0), reason="ContentSecurityPolicyMiddleware is new in Django 6.0")
async def test_djangos_csp_middleware_answers_alike() -> None:
    from django.utils.csp import CSP

    durable, events = await shared_streams()
    with override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE, "django.middleware.csp.ContentSecurityPolicyMiddleware"],
        SECURE_CSP={"default-src": [CSP.SELF], "script-src": [CSP.SELF, CSP.NONCE]},
        SECURE_CSP_REPORT_ONLY={"img-src": [CSP.SELF]},
        PGSTREAMS=rule("counting"),
    ):
        project = Project()
        await reads(project, durable, events)
        await project.every_verb("csp")


def cut_connections() -> int:
    """What a restart of the server does to its clients: every other session on the test database
    ends, sync_to_async's thread's among them (this runs on a thread of its own, whose connection
    it closes), and each has told its client so before this returns (without the timeout,
    ``pg_terminate_backend`` returns once it has signalled, and a request sent at once can meet a
    backend still alive, or one that dies under its query). Returns how many."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]
    finally:
        connection.close()


@pytest.fixture
def main_thread_reconnects() -> Iterator[None]:
    """Close the main thread's connection after the test, which may have cut it, so that the
    flush after the test opens a new one."""
    yield
    connection.close()


@pytest.mark.usefixtures("main_thread_reconnects")
async def test_requests_after_the_databases_connections_were_cut_answer_alike() -> None:
    someone = await sync_to_async(user)("cut")
    durable, events = await shared_streams(owner=someone)
    with override_settings(PGSTREAMS=rule("signed_in")):
        project = Project()
        await sign_in(project, someone)
        csrf = await csrf_token(project)
        for round in range(2):
            assert (await project.agree("GET", f"{durable}?offset=-1")).status_code == 200
            assert (await project.agree("GET", events)).status_code == 200
            assert await sync_to_async(cut_connections, thread_sensitive=False)() > 0
            assert (await project.agree("GET", events)).status_code == 200
            assert (await project.agree("GET", f"{durable}?offset=-1")).status_code == 200
            await sync_to_async(cut_connections, thread_sensitive=False)()
            created = await project.agree("PUT", f"{ENDPOINT}cut/{round}/{{side}}", {**TEXT, **csrf})
            assert created.status_code == 201


COOKIES = {
    "a signed-in session": None,  # the side's own
    "an unknown session": ("sessionid", "x" * 32),
    "a CSRF secret": ("csrftoken", "a" * 32),
    "a CSRF cookie that is no secret": ("csrftoken", "not a secret"),
    "messages that do not verify": ("messages", "forged"),
}
HEADERS = [
    ("Host", "attacker.example"),
    ("Host", "127.0.0.1:8000"),
    ("X-CSRFToken", "a" * 32),
    ("X-CSRFToken", "b" * 32),
    ("Origin", "http://127.0.0.1"),
    ("Origin", "http://elsewhere.example"),
    ("Referer", "http://elsewhere.example/page"),
    ("Content-Type", "text/plain"),
    ("Content-Type", "application/json"),
    ("Content-Type", "application/x-www-form-urlencoded"),
    ("Stream-Closed", "true"),
    ("Stream-Forked-From", f"{ENDPOINT}made-up/shared"),
    ("Authorization", "Basic dXNlcjpwdw=="),
    ("Authorization", "Bearer token"),
    ("Last-Event-ID", "0"),
    ("Last-Event-ID", "nonsense"),
    ("If-None-Match", '"nothing"'),
    ("User-Agent", "made-up"),
    ("X-Forwarded-Proto", "https"),
]
MIDDLEWARE_VARIANTS = {
    "the demo's": None,
    "with LoginRequiredMiddleware": ["django.contrib.auth.middleware.LoginRequiredMiddleware"],
}


@hypothesis_settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    middleware=st.sampled_from(sorted(MIDDLEWARE_VARIANTS)),
    method=st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH"]),
    target=st.sampled_from(["own", "own, another", "shared", "SSE view", "SSE view of no stream"]),
    query=st.sampled_from(["", "?offset=-1", "?offset=nonsense", "?offset=-1&offset=now", "?from=1", "?from=x"]),
    cookies=st.sets(st.sampled_from(sorted(COOKIES)), max_size=3),
    headers=st.lists(st.sampled_from(HEADERS), max_size=4),
    body=st.sampled_from(["", "text", '["json"]', "a=b&csrfmiddlewaretoken=" + "a" * 32]),
    scheme=st.sampled_from(["http", "https"]),
    redirect=st.booleans(),
)
async def test_requests_made_up_by_hypothesis_answer_alike(
    middleware: str,
    method: str,
    target: str,
    query: str,
    cookies: set[str],
    headers: list[tuple[str, str]],
    body: str,
    scheme: str,
    redirect: bool,
) -> None:
    shared = await Stream.objects.filter(path="made-up/shared").afirst()
    if shared is None:
        shared = await pgstreams.acreate_stream(path="made-up/shared")
        await pgstreams.awrite_many(shared.id, ["one", "two"])
        await pgstreams.aclose(shared.id)
    someone = await get_user_model().objects.filter(username="made-up").afirst()
    someone = someone or await sync_to_async(user)("made-up")
    if target.startswith("SSE view"):
        method = "GET"  # the shortcut's only for a GET there
        stream_id = shared.id if target == "SSE view" else uuid.UUID(int=1)
        path = f"/pgstreams/streams/{stream_id}/events"
    else:
        if target == "shared" and method == "DELETE":
            method = "HEAD"  # the one stream both sides share stays
        path = {"own": "made-up/{side}/a", "own, another": "made-up/{side}/b", "shared": "made-up/shared"}[target]
        path = ENDPOINT + path
    with override_settings(
        PGSTREAMS=rule("counting"),
        MIDDLEWARE=[*settings.MIDDLEWARE, *(MIDDLEWARE_VARIANTS[middleware] or [])],
        SECURE_SSL_REDIRECT=redirect,
    ):
        project = Project(scheme)
        if "a signed-in session" in cookies:
            await sign_in(project, someone)
        for side in project.sides.values():
            side.cookies.update(COOKIES[name] for name in sorted(cookies) if COOKIES[name] is not None)
        await project.agree(method, path + query, dict(headers), body)


async def test_a_write_with_credentials_a_browser_sends_by_itself_is_csrf_checked_both_ways() -> None:
    """A browser sends Negotiate, NTLM, Basic and Digest credentials by itself, also in a request
    that a page of another site makes: such a write is checked as Django checks a form's POST
    (here refused, 403: no CSRF cookie), both ways. A Bearer token is its client's own: not
    checked, nor is a request that carries nothing of anyone's. No cookie in any of them."""
    cross_site = {"Origin": "http://elsewhere.example"}
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"}):
        for credentials in ("Negotiate YIIB", "NTLM TlRMTVNTUAAB", "Basic dXNlcjpwdw==", 'Digest username="u"'):
            scheme = credentials.split()[0]
            ambient = {"Authorization": credentials, **cross_site}
            project = Project()
            await project.every_verb(f"ambient/{scheme}", extra=ambient)
            refused = await project.agree("PUT", f"{ENDPOINT}ambient/{scheme}/{{side}}/x", {**TEXT, **ambient})
            assert refused.status_code == 403 and "CSRF" in refused.text, scheme
            assert not any(side.cookies for side in project.sides.values())
        for extra in ({"Authorization": "Bearer a-token"}, {}):
            made = await Project().agree(
                "PUT", f"{ENDPOINT}ambient/{len(extra)}/{{side}}/x", {**TEXT, **cross_site, **extra}
            )
            assert made.status_code == 201, made.text


async def test_an_anonymous_append_sends_the_request_signals_without_a_threads_hop_and_answers_alike(
    hops: Hops,
) -> None:
    """Where every receiver of the request signals is Django's own and no connection outside
    pgstreams' threads is open, the shortcut sends them on the event loop: Django's two hops a
    request (``request_started``, the response's close) are not made, and the answers are the
    same. With a receiver of a project's connected to one signal, or both, that signal goes by
    Django's hop."""
    with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"}):
        project = Project()
        shortcut = project.sides["shortcut"]
        await project.agree("PUT", f"{ENDPOINT}hops/{{side}}", TEXT)
        no_connection_open()
        before = hops.count
        assert (await shortcut.send("PUT", f"{ENDPOINT}hops/alone", TEXT, b"")).status_code == 201
        for _ in range(3):
            assert (await shortcut.send("POST", f"{ENDPOINT}hops/alone", TEXT, b"x")).status_code == 204
        assert hops.count == before, "a request signal or a close went by sync_to_async's thread"
        await project.agree("POST", f"{ENDPOINT}hops/{{side}}", TEXT, "y")
        await project.agree("GET", f"{ENDPOINT}hops/{{side}}?offset=-1")

        def receiver(**kwargs: Any) -> None:
            pass

        for signal, hopped in ((request_started, 1), (request_finished, 1), (None, 2)):
            for each in (request_started, request_finished) if signal is None else (signal,):
                each.connect(receiver)
            try:
                before = hops.count
                assert (await shortcut.send("POST", f"{ENDPOINT}hops/alone", TEXT, b"x")).status_code == 204
                assert hops.count == before + hopped
            finally:
                request_started.disconnect(receiver)
                request_finished.disconnect(receiver)


async def test_a_projects_receivers_of_the_request_signals_see_every_request_alike() -> None:
    """Each request's ``request_started`` (with its scope) and ``request_finished``, sent by
    Django's handler as the sender, on a thread that is not the event loop's: both ways."""
    seen: list[tuple[str, Any, list[str], bool]] = []

    def receiver(signal: Any, sender: Any, **named: Any) -> None:
        name = "started" if signal is request_started else "finished"
        seen.append((name, sender, sorted(named), threading.current_thread() is threading.main_thread()))

    request_started.connect(receiver)
    request_finished.connect(receiver)
    try:
        with override_settings(PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"}):
            project = Project()
            each = {}
            for name, side in project.sides.items():
                seen.clear()
                for method, body in (("PUT", b""), ("POST", b"x"), ("GET", b""), ("DELETE", b"")):
                    await side.send(method, f"{ENDPOINT}receivers/{{side}}", TEXT, body)
                each[name] = list(seen)
    finally:
        request_started.disconnect(receiver)
        request_finished.disconnect(receiver)
    assert each["shortcut"] == each["django"]
    assert each["django"] == [("started", ASGIHandler, ["scope"], False), ("finished", ASGIHandler, [], False)] * 4


@override_settings(
    ROOT_URLCONF="tests.test_shortcut",
    PGSTREAMS={"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"},
)
async def test_a_path_is_resolved_afresh_where_the_urlconf_has_a_converter_of_the_projects() -> None:
    """The shortcut remembers what a path resolves to only where that follows from the path
    alone: here a converter of the project's answers otherwise the second time, both ways."""
    project = Project()
    for matches in (False, True, False):
        Toggle.matches = matches
        answer = await project.agree("GET", f"{ENDPOINT}toggled/{{side}}")
        assert (answer.text == "toggled") if matches else (answer.status_code == 404)


ANYONE = {"DURABLE_AUTHORIZE": "demo_project.chat.durable.allow_everything"}


async def test_a_connection_open_on_sync_to_asyncs_thread_is_closed_as_a_request_starts_and_ends(hops: Hops) -> None:
    """With CONN_MAX_AGE 0, Django's request signals close the connections of the thread they
    are sent on: one open on sync_to_async's thread (a session's load opens one there) is closed
    by the next request through the shortcut, whose signals go by that thread."""
    with override_settings(PGSTREAMS=ANYONE):
        shortcut = Project().sides["shortcut"]
        assert (await shortcut.send("PUT", f"{ENDPOINT}open/alone", TEXT, b"")).status_code == 201
        for _ in range(2):
            await sync_to_async(connection.ensure_connection)()
            assert (await shortcut.send("POST", f"{ENDPOINT}open/alone", TEXT, b"x")).status_code == 204
            assert await sync_to_async(lambda: connection.connection is None)()


@override_settings(CACHES={"default": {"BACKEND": "tests.test_shortcut.ClosingCache"}}, PGSTREAMS=ANYONE)
async def test_a_cache_whose_close_does_something_is_closed_off_the_event_loop_both_ways(hops: Hops) -> None:
    """``request_finished`` closes the caches the request's context opened; one whose close does
    something is closed on sync_to_async's thread (the shortcut) or the request's (Django's),
    never on the event loop, and the answers are the same."""
    caches["default"].get("opened")
    ClosingCache.closed_on.clear()
    project = Project()
    await project.agree("PUT", f"{ENDPOINT}cached/{{side}}", TEXT)
    await project.agree("POST", f"{ENDPOINT}cached/{{side}}", TEXT, "x")
    assert len(ClosingCache.closed_on) == 4
    assert threading.main_thread().name not in ClosingCache.closed_on


async def test_a_request_that_received_files_is_closed_off_the_event_loop_and_answers_alike(hops: Hops) -> None:
    """A write with credentials a browser sends by itself is CSRF-checked, which reads a form's
    files from a POST that carries no token in its headers: the response's close, which closes
    those files, goes by sync_to_async's thread (where a request without files makes no hop)."""
    form = {"Content-Type": "multipart/form-data; boundary=b", "Authorization": "Basic dXNlcjpwdw=="}
    body = '--b\r\nContent-Disposition: form-data; name="f"; filename="f.txt"\r\n\r\nfile\r\n--b--\r\n'
    with override_settings(PGSTREAMS=ANYONE):
        project = Project()
        await csrf_token(project)  # the cookie, without the header
        no_connection_open()
        for files, hopped in ((False, 0), (True, 1)):
            before = hops.count
            refused = await project.agree("POST", f"{ENDPOINT}files/{{side}}", form, body if files else "")
            assert refused.status_code == 403 and hops.count == before + hopped


@pytest.mark.parametrize(
    ("storage", "status"),
    [("fallback.FallbackStorage", 500), ("session.SessionStorage", 500), ("cookie.CookieStorage", 404)],
)
async def test_messages_kept_in_a_session_without_session_middleware_fail_every_request_alike(
    storage: str, status: int
) -> None:
    """A storage of the session's without SessionMiddleware fails in MessageMiddleware's
    ``process_request``, whether or not the request uses messages: 500 both ways."""
    middleware = ["django.middleware.common.CommonMiddleware", "django.contrib.messages.middleware.MessageMiddleware"]
    storage = f"django.contrib.messages.storage.{storage}"
    with override_settings(MIDDLEWARE=middleware, MESSAGE_STORAGE=storage, PGSTREAMS=ANYONE):
        answer = await Project().agree("GET", f"{ENDPOINT}no-sessions/{{side}}?offset=-1")
        assert answer.status_code == status


async def test_a_long_paths_resolution_is_not_remembered_and_answers_alike() -> None:
    """Paths are remembered up to ``cycle.PATH_CHARS`` long: a client sending long unique paths
    makes the process hold none of them."""
    with override_settings(PGSTREAMS=ANYONE):
        project = Project()
        await project.agree("GET", f"{ENDPOINT}short/{{side}}?offset=-1")
        remembered = cycle._resolved.cache_info().currsize
        for i in range(3):
            long = f"{ENDPOINT}{i}-{'x' * cycle.PATH_CHARS}/{{side}}?offset=-1"
            assert (await project.agree("GET", long)).status_code == 404
        assert cycle._resolved.cache_info().currsize == remembered


def notes_its_match(request: Any, action: str, path: str, stream: Any) -> bool:
    """A rule that marks the request's match (as instrumentation might), and allows a request
    whose match it finds unmarked."""
    names = request.resolver_match.app_names
    if not getattr(request, "noted", False):  # once a request, however often the rule is asked
        request.noted = True
        names.append("asked")
    return names.count("asked") == 1


async def test_each_request_has_a_match_of_its_own_both_ways() -> None:
    """A path's remembered match is copied whole for each request: what one request does to its
    ``resolver_match`` (its lists as well as its dicts) no other sees."""
    with override_settings(PGSTREAMS=rule("notes_its_match")):
        project = Project()
        for status in (201, 200):
            assert (await project.agree("PUT", f"{ENDPOINT}noted/{{side}}", TEXT)).status_code == status


@override_settings(ROOT_URLCONF="tests.translated_urls", PGSTREAMS=ANYONE, USE_I18N=True)
async def test_a_translated_route_before_the_endpoint_follows_the_active_language_both_ways() -> None:
    """A route translated with ``gettext_lazy`` is compiled for the active language: the path it
    takes in German is the endpoint's in English, both ways, whatever was resolved before."""
    project = Project()
    for language, answer in (("en", 404), ("de", "translated"), ("en", 404)):
        with translation.override(language):
            got = await project.agree("GET", f"{ENDPOINT}Mitteilungen/{{side}}?offset=-1")
            assert (got.status_code == answer) if language == "en" else (got.text == answer)


async def disconnecting_post(app: Any, path: str, after: float) -> None:
    """A POST whose client leaves ``after`` seconds after sending its body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"text/plain")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        if received == 1:
            return {"type": "http.request", "body": b"x", "more_body": False}
        await asyncio.sleep(after)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(scope, receive, send)


@pytest.mark.parametrize("side", ["django", "shortcut"])
async def test_a_client_leaving_while_its_session_is_saved_leaves_no_connection_open(
    side: str, hops: Hops, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule modifies the session, whose save (on a thread) opens a connection after the
    client has left and the request was cancelled: ``request_finished``, which Django then sends
    by a hop queued behind the save, closes it (``CONN_MAX_AGE = 0``), both ways. (Sent on the
    event loop, it found nothing open yet, and the connection stayed open.)"""
    with override_settings(PGSTREAMS=rule("counting")):
        app = Project().sides[side].app
        no_connection_open()
        save = SessionStore.save

        def slow_save(self: Any, *args: Any, **kwargs: Any) -> Any:
            time.sleep(0.6)  # the client leaves meanwhile
            return save(self, *args, **kwargs)

        monkeypatch.setattr(SessionStore, "save", slow_save)
        await disconnecting_post(app, f"{ENDPOINT}left/{side}", after=0.2)
        await asyncio.sleep(1.5)  # the save done, and whatever was queued behind it
        no_connection_open()
