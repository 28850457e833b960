"""The soak's checker finds each broken promise in a record, and none in a sound one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.soak import check as check_module
from bench.soak.check import Answer, Truth, check
from bench.soak.processes import LOST_DATABASE, raised


def record(run_dir: Path, name: str, *events: dict) -> None:
    (run_dir / "log").mkdir(exist_ok=True)
    with open(run_dir / "log" / f"{name}.jsonl", "a") as log:
        for event in events:
            log.write(json.dumps(event) + "\n")


def truth(chunks: dict[str, list[str]], pruned: dict[str, list[str]] | None = None) -> Truth:
    stored = {path: dict(enumerate(data)) for path, data in {**chunks, **(pruned or {})}.items()}
    return Truth(stored, {p: len(d) for p, d in chunks.items()}, set(pruned or ()), set(chunks) | set(pruned or ()))


def wrote(path: str, data: list[str], offsets: list[int] | None, kind: str = "tx", **extra) -> list[dict]:
    return [
        {"e": "try", "k": kind, "s": path, "d": data},
        {"e": "ok", "k": kind, "s": path, "d": data, "o": offsets, **extra},
    ]


def session(reader: str, path: str, start: int, *batches: tuple[int, list[str]], how: str = "end") -> list[dict]:
    events = [{"e": "start", "r": reader, "n": 0, "s": path, "frm": start}]
    events += [{"e": "chunks", "r": reader, "n": 0, "o": o, "d": d} for o, d in batches]
    return [*events, {"e": "end", "r": reader, "n": 0, "how": how}]


def anomalies(run_dir: Path, t: Truth) -> dict[str, int]:
    return dict(check(run_dir, t).anomalies)


def test_a_sound_record_has_no_anomaly(tmp_path: Path) -> None:
    record(tmp_path, "writer0-0", *wrote("s", ["a", "b"], [0, 1]), *wrote("s", ["c"], [2]), {"e": "done"})
    record(tmp_path, "reader0-0", *session("r", "s", 1, (1, ["b"]), (2, ["c"])), {"e": "done"})
    verdict = check(tmp_path, truth({"s": ["a", "b", "c"]}))
    assert dict(verdict.anomalies) == {} and verdict.written == 3 and verdict.delivered == 2


@pytest.mark.parametrize(
    ("events", "stored", "kind"),
    [
        (wrote("s", ["a"], [0]), {"s": ["a", "x"]}, "phantom"),
        (wrote("s", ["a"], [0]) + wrote("s", ["b"], [1]), {"s": ["a", "a", "b"]}, "stored-twice"),
        (wrote("s", ["a", "b"], [0, 1]), {"s": ["a"]}, "acknowledged-missing"),
        (wrote("s", ["a", "b"], [0, 1]), {"s": ["b", "a"]}, "acknowledged-elsewhere"),
        (
            [{"e": "try", "k": "tx", "s": "s", "d": ["a"]}, {"e": "rolledback", "k": "tx", "s": "s", "d": ["a"]}],
            {"s": ["a"]},
            "rolled-back-stored",
        ),
        (
            [
                {"e": "try", "k": "append", "s": "s", "d": ["a"]},
                {"e": "err", "k": "append", "s": "s", "d": ["a"], "why": "closed", "absent": True},
            ],
            {"s": ["a"]},
            "refused-stored",
        ),
        (
            [{"e": "try", "k": "sw", "s": "s", "d": [d]} for d in "abc"]
            + [{"e": "err", "k": "sw", "s": "s", "d": ["a", "b", "c"], "sess": "1", "why": "x"}],
            {"s": ["a", "c"]},
            "hole",
        ),
        (wrote("s", ["a"], [1], w="t") + wrote("s", ["b"], [0], w="t"), {"s": ["b", "a"]}, "out-of-order-write"),
    ],
)
def test_each_broken_promise_of_a_writer_is_found(tmp_path: Path, events: list[dict], stored: dict, kind: str) -> None:
    record(tmp_path, "writer0-0", *events)
    assert kind in anomalies(tmp_path, truth(stored))


def test_an_unknown_outcome_may_be_stored_once_or_not_at_all(tmp_path: Path) -> None:
    unknown = [{"e": "try", "k": "tx", "s": "s", "d": [d]} for d in "ab"]
    unknown += [{"e": "err", "k": "tx", "s": "s", "d": [d], "why": "lost", "absent": False} for d in "ab"]
    record(tmp_path, "writer0-0", *unknown)
    assert anomalies(tmp_path, truth({"s": ["a"]})) == {}


@pytest.mark.parametrize(
    ("batches", "how", "kind"),
    [
        ([(0, ["a"]), (2, ["c"])], "end", "delivery-gap"),
        ([(0, ["a", "b"]), (1, ["b", "c"])], "end", "delivered-twice"),
        ([(0, ["a", "c"])], "stopped", "wrong-chunk"),
        ([(0, ["a", "b", "c", "d"])], "end", "unknown-offset"),
        ([(0, ["a", "b"])], "end", "ended-early"),
        ([(0, ["a"])], "gone", "false-gone"),
        ([(0, ["a"])], "error", "reader-error"),
    ],
)
def test_each_broken_promise_to_a_reader_is_found(tmp_path: Path, batches: list, how: str, kind: str) -> None:
    record(tmp_path, "writer0-0", *wrote("s", ["a", "b", "c"], [0, 1, 2]))
    record(tmp_path, "reader0-0", *session("r", "s", 0, *batches, how=how))
    assert kind in anomalies(tmp_path, truth({"s": ["a", "b", "c"]}))


def test_a_pruned_streams_readers_may_be_told_it_is_gone_and_checked_against_its_copy(tmp_path: Path) -> None:
    record(tmp_path, "writer0-0", *wrote("p", ["a", "b"], [0, 1]))
    record(tmp_path, "reader0-0", *session("r", "p", 0, (0, ["a"]), how="gone"))
    assert anomalies(tmp_path, truth({}, pruned={"p": ["a", "b"]})) == {}


def test_a_session_left_unended_is_an_anomaly_only_if_its_process_finished(tmp_path: Path) -> None:
    record(tmp_path, "writer0-0", *wrote("s", ["a"], [0]))
    unended = session("r", "s", 0, (0, ["a"]))[:-1]
    record(tmp_path, "reader0-0", *unended)  # killed: no "done"
    assert anomalies(tmp_path, truth({"s": ["a"]})) == {}
    record(tmp_path, "reader1-0", *[{**e, "r": "q"} for e in unended], {"e": "done"})
    assert "unfinished-session" in anomalies(tmp_path, truth({"s": ["a"]}))


def test_a_gap_in_the_table_and_a_stream_that_vanished_are_found(tmp_path: Path) -> None:
    record(tmp_path, "writer0-0", *wrote("s", ["a"], [0]), *wrote("s", ["c"], [2]))
    t = truth({"s": ["a", "b", "c"]})
    del t.chunks["s"][1]
    t.created.add("lost")
    found = anomalies(tmp_path, t)
    assert "table-gap" in found and "vanished" in found


WHOLE = ["0 ", "1 ", "2 ", "end"]


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (Answer(True, 2, WHOLE), None),
        (Answer(False, 1, WHOLE[:2]), "generation-unfinished"),
        (Answer(True, 2, ["0 ", "1 ", "1 ", "2 ", "end"]), "generation-repeated"),  # a fenced run's write stored
        (Answer(True, 1, ["0 ", "2 ", "end"]), "generation-not-whole"),
        (Answer(True, 1000, ["0 ", "gave up"]), "generation-not-whole"),  # every attempt failed
    ],
)
def test_each_generation_not_written_whole_once_is_found(tmp_path: Path, answer: Answer, kind: str | None) -> None:
    record(tmp_path, "writer1-0", {"e": "generation", "s": "g/writer1-0.g1/count/3", "id": "x"})
    t = truth({})
    t.generations["g/writer1-0.g1/count/3"] = answer
    verdict = check(tmp_path, t)
    assert dict(verdict.anomalies) == ({kind: 1} if kind else {}) and verdict.generations == 1
    assert verdict.takeovers == answer.attempts - 1


def test_a_generation_started_and_not_in_the_table_is_found(tmp_path: Path) -> None:
    record(tmp_path, "writer1-0", {"e": "generation", "s": "g/writer1-0.g1/count/3", "id": "x"})
    assert anomalies(tmp_path, truth({})) == {"generation-vanished": 1}


def parts(*words: str, repeat: int | None = None) -> list[str]:
    """An AI SDK answer's stored parts, its deltas ``words`` (the one at ``repeat`` twice)."""
    deltas = [json.dumps({"type": "text-delta", "id": "text-1", "delta": w}) for w in words]
    if repeat is not None:
        deltas.insert(repeat, deltas[repeat])
    head = [json.dumps({"type": kind}) for kind in ("start", "start-step", "text-start")]
    return head + deltas + [json.dumps({"type": kind}) for kind in ("text-end", "finish-step", "finish")]


@pytest.mark.parametrize(
    ("stored", "kind"),
    [
        (parts("w0 ", "w1 "), None),
        (parts("w0 ", "w1 ", repeat=1), "generation-repeated"),
        (parts("w0 "), "generation-not-whole"),
        (parts("w1 ", "w0 "), "generation-not-whole"),
    ],
)
def test_an_ai_sdk_answer_is_checked_part_by_part(tmp_path: Path, stored: list[str], kind: str | None) -> None:
    t = truth({})
    t.generations["g/writer1-0.g1/answer/2"] = Answer(True, 1, stored)
    assert anomalies(tmp_path, t) == ({kind: 1} if kind else {})


HEAD = [["start", None], ["start-step", None], ["text-start", None]]
WORDS = [["text-delta", "w0 "], ["text-delta", "w1 "]]
TAIL = [["text-end", None], ["finish-step", None], ["finish", None]]
WHOLE_READ = {"e": "aisdk-answer", "texts": ["w0 w1 "], "parts": ["step-start", "text"], "seen": HEAD + WORDS + TAIL}


@pytest.mark.parametrize(
    ("events", "kind"),
    [
        ([WHOLE_READ], None),
        ([{"e": "aisdk-error", "why": "cut", "seen": HEAD + WORDS[:1]}, WHOLE_READ], None),
        ([{**WHOLE_READ, "texts": ["w0 w1 w1 "]}], "aisdk-wrong-answer"),
        ([{**WHOLE_READ, "texts": ["w0 ", "w1 "], "parts": ["step-start", "text", "text"]}], "aisdk-wrong-answer"),
        ([{**WHOLE_READ, "seen": HEAD[:1] + HEAD + WORDS + TAIL}], "aisdk-wrong-answer"),  # a part twice
        ([{"e": "aisdk-error", "why": "no text part", "seen": HEAD[:2] + WORDS[:1]}], "aisdk-wrong-parts"),
        ([{"e": "aisdk-error", "why": "cut"}, {"e": "aisdk-gone"}], "false-gone"),
        ([], "unfinished-session"),
    ],
)
def test_each_broken_promise_to_the_ai_sdk_reader_is_found(tmp_path: Path, events: list, kind: str | None) -> None:
    path = "g/writer1-0.g1/answer/2"
    started = [{"e": "aisdk-start", "s": path, "attempt": i} for i in range(max(1, len(events)))]
    ended = [{**event, "s": path, "attempt": i} for i, event in enumerate(events)]
    record(tmp_path, "aisdk0-0", *started, *ended, {"e": "done"})
    t = truth({})
    t.generations[path] = Answer(True, 1, parts("w0 ", "w1 "))
    assert anomalies(tmp_path, t) == ({kind: 1} if kind else {})


def test_the_truth_keeps_the_first_copy_of_a_stream_whose_prune_was_cut_short(tmp_path: Path) -> None:
    """A prune that a switchover cut after some batches leaves part of the stream, which the
    next prune copies again: the first copy is the stream's."""
    record(
        tmp_path,
        "coordinator",
        {"e": "created", "s": "s"},
        {"e": "pruning", "s": "s", "chunks": [[0, "a"], [1, "b"], [2, "c"]]},
        {"e": "pruning-generation", "s": "g", "attempts": 1, "chunks": ["0 ", "end"]},
        {"e": "pruning", "s": "s", "chunks": [[2, "c"]]},
        {"e": "pruning-generation", "s": "g", "attempts": 1, "chunks": ["end"]},
    )
    copied = check_module.copied(tmp_path)
    assert copied.chunks == {"s": {0: "a", 1: "b", 2: "c"}} and copied.pruned == {"s", "g"}
    assert copied.created == {"s"} and copied.generations["g"].chunks == ["0 ", "end"]


def test_a_task_worker_that_exits_on_a_multi_line_database_error_is_told_from_a_crash() -> None:
    """libpq's errors over several hosts run over several lines, and another thread may log while
    the traceback is written: the exception is the first line of the last traceback that names one."""
    lost = (
        "Traceback (most recent call last):\n"
        '  File "base.py", line 256, in connect\n'
        "    self.connection = self.get_new_connection(conn_params)\n"
        "psycopg.OperationalError: connection failed: session is read-only\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "connection.py", line 134, in connect\n'
        "    raise new_ex.with_traceback(None)\n"
        "django.db.utils.OperationalError: connection failed: session is read-only\n"
        "Multiple connection attempts failed. All failures were:\n"
        "- host: '/tmp/x', port: '5441', hostaddr: None: connection failed: the database system is shutting down\n"
    )
    assert raised(lost).startswith(LOST_DATABASE)
    crashed = lost.replace("django.db.utils.OperationalError", "KeyError")
    assert raised(crashed) == "KeyError: connection failed: session is read-only"
    assert raised("no traceback here\n") == ""
    # Another thread logs while the traceback is written (found by CI's seed).
    logged = "pgstreams: generation g lost its writer; attempt 2 of 1000 enqueued\n"
    interleaved = lost.replace("    raise new_ex", logged + "    raise new_ex")
    assert raised(interleaved).startswith(LOST_DATABASE)
