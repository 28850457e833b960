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

import dataclasses
import difflib
import re
import uuid
from collections.abc import Iterator
from http.cookies import SimpleCookie
from typing import Any

import django
import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core.asgi import get_asgi_application
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import pgstreams
from pgstreams.durable.asgi import DurableStreamsFirst
from pgstreams.models import Stream

pytestmark = pytest.mark.django_db(transaction=True)

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
