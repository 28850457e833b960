"""Settings: the one place that reads ``settings.PGSTREAMS``, and the one declaration of each.

Each setting is one ``Setting``: its key, default, rule, the text of a valid value, its system
check id and its meaning. The accessor is the declaration itself (``conf.notify_mode()``), read
when used, so ``override_settings`` takes effect at once; checks, defaults and the documentation's
settings table (docs/reference/settings.md, made when the site is built) derive from the
declarations.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

NOTIFY_MODES = ("buffered", "per_write", "off")
# PostgreSQL's synchronous_commit values, from the one whose commit waits least to the one that
# waits most (with a synchronous standby: nothing, local flush, standby write, standby flush,
# standby replay).
SYNCHRONOUS_COMMIT_LEVELS = ("off", "local", "remote_write", "on", "remote_apply")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Rule:
    """What a valid value is: a test, and how to say it in an error."""

    test: Callable[[Any], bool]
    text: str


def _one_of(values: tuple[str, ...], *, or_none: str = "") -> Rule:
    listed = ", ".join(map(repr, values))
    if or_none:
        return Rule(lambda v: v is None or v in values, f"None ({or_none}) or one of {listed}")
    return Rule(lambda v: v in values, f"one of {listed}")


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _alias(none: str = "", of: str = "") -> Rule:
    text = f"a key of settings.DATABASES{of}"
    if none:
        return Rule(lambda v: v is None or (isinstance(v, str) and v in settings.DATABASES), f"None ({none}) or {text}")
    return Rule(lambda v: isinstance(v, str) and v in settings.DATABASES, text)


def _importable(path: Any) -> bool:
    if not isinstance(path, str):
        return False
    try:
        return callable(import_string(path))
    except ImportError:
        return False


SECONDS = Rule(lambda v: (_whole(v) or isinstance(v, float)) and v > 0, "a positive number of seconds")


T = TypeVar("T")
_UNSET: Any = object()


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One key of ``settings.PGSTREAMS``. Calling it returns the value in effect, validated
    (``ImproperlyConfigured`` says what is wrong) and converted by ``convert``."""

    name: str
    default: Any
    rule: Rule
    check_id: str
    doc: str  # the "meaning" cell of the settings table (Markdown, links relative to docs/reference/)
    convert: Callable[[Any], T] = lambda v: v

    def __post_init__(self) -> None:
        SETTINGS[self.name] = self

    def __call__(self) -> T:
        try:
            return _validated[self.name]
        except KeyError:
            pass
        value = self.raw()
        error = self.problem(value)
        if error:
            raise ImproperlyConfigured(error)
        converted = _validated[self.name] = self.convert(value)
        return converted

    def raw(self) -> Any:
        """The value in ``settings.PGSTREAMS``, or the default; not validated."""
        return _user_settings().get(self.name, self.default)

    def problem(self, value: Any = _UNSET) -> str | None:
        """What is wrong with ``value`` (by default the value in effect), or None when it is valid."""
        if value is _UNSET:
            value = self.raw()
        if self.rule.test(value):
            return None
        return f"PGSTREAMS[{self.name!r}] is {value!r}; it must be {self.rule.text}"


SETTINGS: dict[str, Setting[Any]] = {}  # every setting, in declaration order
_validated: dict[str, Any] = {}  # values checked since the settings last changed


@receiver(setting_changed)
def _forget_validated(**kwargs: Any) -> None:
    _validated.clear()


def _user_settings() -> dict[str, Any]:
    value = getattr(settings, "PGSTREAMS", None)
    return value if isinstance(value, dict) else {}


def unknown_keys() -> list[str]:
    """Keys of ``settings.PGSTREAMS`` that pgstreams does not know (most likely typos)."""
    return sorted(set(_user_settings()) - set(SETTINGS))


notify_mode: Setting[str] = Setting(
    "NOTIFY_MODE",
    "buffered",
    _one_of(NOTIFY_MODES),
    "pgstreams.E002",
    '`"buffered"`: notify after commit through the per-process buffer; `"per_write"`: `pg_notify` inside each '
    'writing transaction (the classic design, kept as the benchmark\'s baseline); `"off"`: no notifications, '
    "readers rely on polling",
)
flush_interval: Setting[float] = Setting(
    "FLUSH_INTERVAL",
    0.01,
    SECONDS,
    "pgstreams.E003",
    "seconds between two flushes of a process's buffer, at the most; an idle flusher sends a new entry at once",
    float,
)
poll_interval: Setting[float] = Setting(
    "POLL_INTERVAL",
    1.0,
    SECONDS,
    "pgstreams.E004",
    "seconds between fallback polls of a process's listener (jittered by ±20%)",
    float,
)
channel: Setting[str] = Setting(
    "CHANNEL",
    "pgstreams",
    Rule(
        lambda v: isinstance(v, str) and bool(_IDENTIFIER.match(v)) and len(v.encode()) <= 63,
        "a plain SQL identifier (letters, digits and underscores, not starting with a digit) of at most 63 bytes",
    ),
    "pgstreams.E005",
    "the LISTEN/NOTIFY channel, or with `NOTIFY_SHARDS` the channels' common name (`pgstreams_0`, `pgstreams_1`, "
    "...): a plain identifier of at most 63 bytes, suffix included (`pgstreams.E027`)",
)
max_chunk_bytes: Setting[int] = Setting(
    "MAX_CHUNK_BYTES",
    65536,
    Rule(lambda v: _whole(v) and v > 0, "a positive whole number of bytes"),
    "pgstreams.E006",
    "the largest chunk `write()` accepts, in bytes of UTF-8",
)
database: Setting[str] = Setting(
    "DATABASE", "default", _alias(), "pgstreams.E007", "the database alias that holds the streams"
)
_authorize: Setting[str] = Setting(
    "AUTHORIZE",
    "pgstreams.auth.default_authorize",
    Rule(_importable, "the dotted path of a callable(user, stream) -> bool"),
    "pgstreams.E008",
    "who may read a stream over WebSocket and SSE (see Authorization)",
)
prepared_statements: Setting[bool] = Setting(
    "PREPARED_STATEMENTS",
    True,
    Rule(lambda v: isinstance(v, bool), "True or False"),
    "pgstreams.E009",
    "writes run as a server-side prepared statement on Django's connection (parsed and planned once per "
    "connection: about 30% more writes/s measured); set `False` behind a pooler that cannot keep prepared "
    "statements (PgBouncer before 1.21 in transaction mode)",
)
listen_database_setting: Setting[str | None] = Setting(
    "LISTEN_DATABASE",
    None,
    _alias("use DATABASE", " that connects to Postgres directly"),
    "pgstreams.E010",
    "the alias of the listener's LISTEN connection (default: `DATABASE`); LISTEN needs a session of its own, so "
    "when `DATABASE` goes through PgBouncer in transaction pooling mode, point this at an alias that connects to "
    "Postgres directly (`manage.py check` warns, `pgstreams.W002`)",
)
metrics_token: Setting[str | None] = Setting(
    "METRICS_TOKEN",
    None,
    Rule(lambda v: v is None or (isinstance(v, str) and len(v) >= 16), "None or a secret of 16 characters or more"),
    "pgstreams.E011",
    "a secret (16 characters or more) that lets a scraper read `metrics/` with `Authorization: Bearer <token>`; "
    "staff can always read it",
)
synchronous_commit: Setting[str | None] = Setting(
    "SYNCHRONOUS_COMMIT",
    None,
    _one_of(SYNCHRONOUS_COMMIT_LEVELS, or_none="the server's own setting"),
    "pgstreams.E012",
    'the `synchronous_commit` level of writes that pass none (`"off"`, `"local"`, `"remote_write"`, `"on"`, '
    '`"remote_apply"`); `None` keeps the server\'s own',
)
read_database_setting: Setting[str | None] = Setting(
    "READ_DATABASE",
    None,
    _alias("read from DATABASE", ", such as a hot standby of DATABASE"),
    "pgstreams.E013",
    "the alias readers fetch chunks and stream state from, such as a hot standby of `DATABASE`; writes, LISTEN "
    "and authorization stay on `DATABASE` (see [readers on a hot standby](../howto/standby.md))",
)
connect_timeout: Setting[int] = Setting(
    "CONNECT_TIMEOUT",
    5,
    Rule(lambda v: _whole(v) and v >= 2, "a whole number of seconds, 2 or more (libpq's connect_timeout)"),
    "pgstreams.E014",
    "seconds (a whole number, 2 or more) to open one of pgstreams' own connections (listener, fetcher, flusher, "
    "appender)",
)
query_timeout: Setting[float] = Setting(
    "QUERY_TIMEOUT",
    5.0,
    SECONDS,
    "pgstreams.E015",
    "seconds a query on pgstreams' own connections may take, its whole answer included; past it the connection "
    "is cut and opened again (a fetch round that ran out of time is split into smaller ones). It also sets their "
    "TCP keepalives and `tcp_user_timeout`, so a peer that vanished is noticed within seconds (see "
    "[failover](../howto/deploy.md#failover-and-dead-connections))",
    float,
)
listen_check_interval: Setting[float] = Setting(
    "LISTEN_CHECK_INTERVAL",
    5.0,
    SECONDS,
    "pgstreams.E016",
    "seconds between two checks of the listener's LISTEN connection with a query, which also reads how full "
    "Postgres' notification queue is (`NOTIFY_QUEUE_GUARD`)",
    float,
)
async_threads: Setting[int] = Setting(
    "ASYNC_THREADS",
    4,
    Rule(lambda v: _whole(v) and v > 0, "a positive whole number of threads"),
    "pgstreams.E017",
    "threads per process on which `awrite` and the other async twins run their queries, and as many for the "
    "Durable Streams endpoint's reads and as many for its writes, each keeping a Django connection of its own open "
    "(the WebSocket and SSE endpoints' authorization lookups have two threads of their own, so writes waiting on "
    "locks never hold up a connect or a read)",
)


append_interval: Setting[float] = Setting(
    "APPEND_INTERVAL",
    0.02,
    SECONDS,
    "pgstreams.E018",
    "seconds between two batches of the append path (`append`, `aappend`, `stream_writer`) when appends come "
    "faster than they commit: a batch goes when the previous one has committed, and, if appends came while it "
    "committed, no sooner than this long after it began",
    float,
)
append_batch: Setting[int] = Setting(
    "APPEND_BATCH",
    10000,
    Rule(lambda v: _whole(v) and v > 0, "a positive whole number of chunks"),
    "pgstreams.E019",
    "chunks committed at most in one batch of the append path (a batch also ends at 8 MiB of chunk data)",
)
window_bytes: Setting[int] = Setting(
    "WINDOW_BYTES",
    16384,
    Rule(lambda v: _whole(v) and v >= 1024, "a whole number of bytes, 1024 or more"),
    "pgstreams.E020",
    "the memory a process's listener keeps at most for the latest chunks of one followed stream (their text as "
    "Python stores it plus 64 bytes each, but always the last page fetched); a reader behind them fetches "
    "its own pages",
)


_durable_authorize: Setting[str] = Setting(
    "DURABLE_AUTHORIZE",
    "pgstreams.auth.default_durable_authorize",
    Rule(_importable, "the dotted path of a callable(request, action, path, stream) -> bool"),
    "pgstreams.E021",
    "who may create, append to, close, delete or read a stream at the Durable Streams endpoint, a function or an "
    "`async def` one (see [Durable Streams](../howto/durable-streams.md)); by default reads follow `AUTHORIZE` and "
    "everything else is refused",
)
long_poll_timeout: Setting[float] = Setting(
    "LONG_POLL_TIMEOUT",
    20.0,
    SECONDS,
    "pgstreams.E022",
    "seconds a Durable Streams long-poll waits for data before it answers `204 No Content`",
    float,
)
max_fork_bytes: Setting[int] = Setting(
    "MAX_FORK_BYTES",
    16 << 20,
    Rule(lambda v: _whole(v) and v > 0, "a positive whole number of bytes"),
    "pgstreams.E023",
    "what a Durable Streams fork may copy of its source at most: the inherited chunks' data plus 100 bytes a "
    "chunk for its row (a fork owns copies of the chunks it inherits); a fork of more is refused with 400",
)
max_fork_depth: Setting[int] = Setting(
    "MAX_FORK_DEPTH",
    16,
    Rule(lambda v: _whole(v) and v > 0, "a positive whole number of forks"),
    "pgstreams.E024",
    "how many forks a Durable Streams chain may hold at most, from its first stream (a fork of a fork of ...); "
    "a fork past it is refused with 400",
)

notify_queue_guard: Setting[float | None] = Setting(
    "NOTIFY_QUEUE_GUARD",
    0.001,
    Rule(
        lambda v: v is None or (isinstance(v, float) and 0 < v < 1),
        "None (never end a listener) or a fraction between 0 and 1, such as 0.001",
    ),
    "pgstreams.E025",
    "the fraction of Postgres' notification queue in use past which every process ends the pgstreams listener "
    "sessions stuck sending to a process that stopped reading (see [the notification queue]"
    "(../howto/operations.md#the-notification-queue)); 0.001 is 8 MB of the default 8 GB queue; `None` never "
    "ends one (nor gives the LISTEN session a server-side `tcp_user_timeout`)",
)

notify_shards: Setting[int] = Setting(
    "NOTIFY_SHARDS",
    1,
    Rule(lambda v: _whole(v) and 1 <= v <= 4096, "a whole number of channels from 1 to 4096"),
    "pgstreams.E026",
    "notification channels the streams are spread over, by stream id; a process LISTENs only to those of the "
    "streams its readers follow, so it receives and parses their notifications, not the cluster's (see "
    "[a fleet](../howto/operations.md#a-fleet-of-processes)). Every process of a fleet must use the same value",
)
day_partitions: Setting[bool] = Setting(
    "DAY_PARTITIONS",
    False,
    Rule(lambda v: isinstance(v, bool), "True or False"),
    "pgstreams.E028",
    "whether streams are made with time-ordered ids (UUIDv7: the time of creation in milliseconds, then 74 random "
    "bits), so that once `manage.py pgstreams_partition` has partitioned the chunks by day, each UTC day's streams "
    "hold their chunks in one partition, which pruning drops whole (see [retention by day](../howto/operations.md"
    "#retention-by-day)). Such an id tells when its stream was made",
)


def listen_database() -> str:
    """The alias of the listener's LISTEN connection: LISTEN_DATABASE, else DATABASE."""
    return listen_database_setting() or database()


def read_database() -> str:
    """The alias readers fetch chunks and stream state from: READ_DATABASE, else DATABASE."""
    return read_database_setting() or database()


def authorize() -> Callable[[Any, Any], bool]:
    """The AUTHORIZE callable, imported at each call (so patching it takes effect)."""
    return import_string(_authorize())


def durable_authorize() -> Callable[[Any, str, str, Any], bool | Awaitable[bool]]:
    """The DURABLE_AUTHORIZE callable, imported at each call."""
    return import_string(_durable_authorize())
