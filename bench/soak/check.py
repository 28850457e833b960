"""The soak's verdict: the processes' record (``record``) held against the table.

The truth is every chunk of the soak's streams: those in the table at the end, and those of the
streams pruned during the run (the coordinator copied them before it pruned). What must hold:

- Writers: every stored chunk was attempted by someone (else ``phantom``), and is stored once
  (``stored-twice``). A write that returned is stored where it was told (``acknowledged-missing``,
  ``acknowledged-elsewhere``); one rolled back, or refused for certain, is not stored
  (``rolled-back-stored``, ``refused-stored``); one whose outcome is unknown is stored at most
  once. A stream writer's chunks are stored as a prefix of what it sent, in order (``hole``);
  one writer's successive writes to a stream get growing offsets (``out-of-order-write``).
  Offsets are gap-free (``table-gap``), and no stream the coordinator made vanished without
  being pruned (``vanished``).
- Readers: a session gets chunks from where it started, each offset once and in order, across
  its reconnects (``delivery-gap``, ``delivered-twice``, ``bad-next-offset``), each the chunk
  stored at that offset (``wrong-chunk``, ``unknown-offset``). A session that ends at the end of
  a stream got all of it (``ended-early``); only a pruned stream's readers may be told it is gone
  or pruned (``false-gone``); a reader never fails otherwise (``reader-error``) and never leaves a
  session unended unless it was killed (``unfinished-session``).
- Generations: every answer the task workers wrote is whole, once: closed, its chunks exactly
  what its task writes (``"0 "`` to ``"<n-1> "`` then ``"end"``; or an AI SDK answer's parts,
  its deltas ``"w0 "`` to ``"w<n-1> "``) (``generation-unfinished``, ``generation-repeated``
  when a chunk is stored twice, as a fenced run's write would be, ``generation-not-whole``
  otherwise), and every generation a writer started is in the table (``generation-vanished``).
  Each read of the AI SDK reader got the answer's parts in order, all of them to its ``finish``
  (then a message of one text part, the text the task wrote: ``aisdk-wrong-answer``) or a prefix
  when it ended early (``aisdk-wrong-parts``), and ended (``unfinished-session``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES = 5  # examples kept per anomaly kind


@dataclass
class Verdict:
    written: int = 0  # chunks stored (and pruned), each checked against the writers' record
    delivered: int = 0  # chunks delivered to readers, each checked against the truth
    generations: int = 0  # answers checked
    takeovers: int = 0  # of those answers, by the task workers
    aisdk_answers: set[str] = field(default_factory=set)  # the AI SDK answers read to their finish
    attempts: Counter[str] = field(default_factory=Counter)  # by kind and outcome
    sessions: Counter[str] = field(default_factory=Counter)  # by reader kind and ending
    anomalies: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def anomaly(self, kind: str, example: str) -> None:
        self.anomalies[kind] += 1
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)


@dataclass
class Truth:
    """Every chunk of the soak's streams, by path and offset, and what became of each stream."""

    chunks: dict[str, dict[int, str]]
    next_offsets: dict[str, int]  # of the streams in the table at the end
    pruned: set[str]  # the paths of the streams and generations pruned
    created: set[str]
    generations: dict[str, Answer] = field(default_factory=dict)  # by path


@dataclass
class Answer:
    """A generation as the table has it at the end."""

    closed: bool
    attempts: int  # runs of its task: 1, and one more for each takeover
    chunks: list[str]


def copied(run_dir: Path) -> Truth:
    """What the coordinator's record holds of the truth: the streams it made, and the copy of
    each stream and generation it pruned, the first copy of each (a prune that a fault cut short
    after some batches leaves part of a stream for the next prune, whose copy is that part)."""
    truth = Truth({}, {}, set(), set())
    for event in _events(run_dir)["coordinator"]:
        if event["e"] == "created":
            truth.created.add(event["s"])
        elif event["e"] in ("pruning", "pruning-generation") and event["s"] not in truth.pruned:
            truth.pruned.add(event["s"])
            if event["e"] == "pruning":
                truth.chunks[event["s"]] = {offset: data for offset, data in event["chunks"]}
            else:
                truth.generations[event["s"]] = Answer(True, event["attempts"], event["chunks"])
    return truth


def _events(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    logs = {}
    for path in sorted((run_dir / "log").glob("*.jsonl")):
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass  # a line cut short by SIGKILL
        logs[path.stem] = events
    return logs


def check(run_dir: Path, truth: Truth) -> Verdict:
    verdict = Verdict()
    logs = _events(run_dir)
    where: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for path, chunks in truth.chunks.items():
        for offset, data in chunks.items():
            where[data].append((path, offset))
    verdict.written = sum(len(c) for c in truth.chunks.values())
    _check_table(truth, where, verdict)
    _check_writers(logs, truth, where, verdict)
    _check_readers(logs, truth, verdict)
    _check_generations(logs, truth, verdict)
    _check_aisdk_reader(logs, truth, verdict)
    return verdict


def _check_generations(logs: dict[str, list[dict[str, Any]]], truth: Truth, verdict: Verdict) -> None:
    for path, answer in truth.generations.items():
        verdict.generations += 1
        verdict.takeovers += answer.attempts - 1
        chunks = answer.chunks
        if not answer.closed:
            verdict.anomaly("generation-unfinished", f"{path}: {len(chunks)} chunks, open")
        elif _written(path, chunks) != _whole(path):
            kind = "generation-repeated" if len(set(chunks)) < len(chunks) else "generation-not-whole"
            verdict.anomaly(kind, f"{path}: {chunks[:8]}...{chunks[-3:]} ({len(chunks)} chunks)")
    started = {e["s"] for events in logs.values() for e in events if e["e"] == "generation"}
    for path in sorted(started - set(truth.generations)):
        verdict.anomaly("generation-vanished", f"{path} was started, and is not in the table")


def _check_aisdk_reader(logs: dict[str, list[dict[str, Any]]], truth: Truth, verdict: Verdict) -> None:
    for name, events in logs.items():
        unended: set[tuple[str, int]] = set()
        for event in events:
            if event["e"] == "aisdk-start":
                unended.add((event["s"], event["attempt"]))
            elif event["e"] in ("aisdk-answer", "aisdk-error", "aisdk-gone"):
                unended.discard((event["s"], event["attempt"]))
            if event["e"].startswith("aisdk-") and event["e"] != "aisdk-start":
                verdict.sessions[event["e"].replace("-", " ")] += 1
            if event["e"] in ("aisdk-answer", "aisdk-error"):
                _check_aisdk_read(name, event, verdict)
            if event["e"] == "aisdk-gone" and event["s"] not in truth.pruned:
                verdict.anomaly("false-gone", f"{name}: {event['s']} was told gone, and was never pruned")
        if unended and any(e["e"] == "done" for e in events):
            verdict.anomaly("unfinished-session", f"{name}: AI SDK reads {sorted(unended)[:5]} never ended")


def _check_aisdk_read(name: str, event: dict[str, Any], verdict: Verdict) -> None:
    """One read of the AI SDK reader: the parts the client gave, in order, are the answer's, or
    (a read that ended early or failed) a prefix of them; a read to the finish made a message of
    one text part, the text the task wrote."""
    seen, whole = [tuple(part) for part in event.get("seen", [])], _whole(event["s"])
    if event["e"] == "aisdk-error" and seen != whole[: len(seen)]:
        verdict.anomaly("aisdk-wrong-parts", f"{name}: {event['s']} ended early after {seen[-5:]}")
    if event["e"] == "aisdk-answer" and (
        seen != whole or event["parts"] != ["step-start", "text"] or event["texts"] != ["".join(_words(event["s"]))]
    ):
        verdict.anomaly("aisdk-wrong-answer", f"{name}: {event['s']} read as {event['parts']} {event['texts']}")
    if event["e"] == "aisdk-answer":
        verdict.aisdk_answers.add(event["s"])


def _generation(path: str) -> tuple[str, int]:
    """What a generation's path (``.../<kind>/<n>``) says: its task's kind, and its length."""
    kind, n = path.rsplit("/", 2)[1:]
    return kind, int(n)


def _words(path: str) -> list[str]:
    return [f"w{i} " for i in range(_generation(path)[1])]


def _whole(path: str) -> list[Any]:
    """What the task of the generation at ``path`` (``.../<kind>/<n>``) writes, as ``_written``
    reads it."""
    kind, n = _generation(path)
    if kind == "count":
        return [f"{i} " for i in range(n)] + ["end"]
    head, tail = ("start", "start-step", "text-start"), ("text-end", "finish-step", "finish")
    return [(kind, None) for kind in head] + [("text-delta", w) for w in _words(path)] + [(k, None) for k in tail]


def _written(path: str, chunks: list[str]) -> list[Any]:
    """A generation's chunks: text as it is; an AI SDK answer's parts as (type, delta)."""
    if _generation(path)[0] == "count":
        return chunks
    try:
        return [(part["type"], part.get("delta")) for part in map(json.loads, chunks)]
    except (ValueError, TypeError, KeyError):
        return chunks  # not parts: not whole


def _check_table(truth: Truth, where: dict[str, list[tuple[str, int]]], verdict: Verdict) -> None:
    for data, places in where.items():
        if len(places) > 1:
            verdict.anomaly("stored-twice", f"{data} at {places}")
    for path, chunks in truth.chunks.items():
        end = truth.next_offsets.get(path, max(chunks, default=-1) + 1)
        missing = [o for o in range(end) if o not in chunks]
        if missing:
            verdict.anomaly("table-gap", f"{path} lacks offsets {missing[:10]} of {end}")
    for path in truth.created - set(truth.chunks) - set(truth.next_offsets) - truth.pruned:
        verdict.anomaly("vanished", f"{path} is gone, and was not pruned")


def _check_writers(
    logs: dict[str, list[dict[str, Any]]], truth: Truth, where: dict[str, list[tuple[str, int]]], verdict: Verdict
) -> None:
    tried: set[str] = set()
    for name, events in logs.items():
        last: dict[tuple[str, str], int] = {}
        for event in events:
            kind = event.get("k")
            if event["e"] == "try":
                tried.update(event["d"])
                continue
            if event["e"] not in ("ok", "err", "rolledback"):
                continue
            verdict.attempts[f"{kind} {event['e']}"] += 1
            path, data = event["s"], event["d"]
            if kind == "sw":
                _check_stream_writer(event, where, verdict)
            elif event["e"] == "ok":
                places = [where.get(d, []) for d in data]
                for i, (d, found) in enumerate(zip(data, places, strict=True)):
                    wanted = None if event["o"] is None else (path, event["o"][i])
                    if not found:
                        verdict.anomaly("acknowledged-missing", f"{name}: {kind} {d} -> {wanted or path}")
                    elif wanted is not None and found[0] != wanted:
                        verdict.anomaly("acknowledged-elsewhere", f"{name}: {kind} {d} told {wanted}, at {found}")
                    elif wanted is None and found[0][0] != path:
                        verdict.anomaly("acknowledged-elsewhere", f"{name}: {kind} {d} for {path}, at {found}")
                if "w" in event and event["o"]:
                    key = (event["w"], path)
                    if key in last and event["o"][0] <= last[key]:
                        verdict.anomaly(
                            "out-of-order-write", f"{name}/{event['w']}: {path} {last[key]} then {event['o']}"
                        )
                    last[key] = event["o"][-1]
            elif event["e"] == "rolledback":
                for d in data:
                    if d in where:
                        verdict.anomaly("rolled-back-stored", f"{name}: {d} at {where[d]}")
            elif event.get("absent"):
                for d in data:
                    if d in where:
                        verdict.anomaly("refused-stored", f"{name}: {kind} {d} ({event['why']}) at {where[d]}")
    for data, places in where.items():
        if data not in tried:
            verdict.anomaly("phantom", f"{data} at {places}: nobody wrote it")


def _check_stream_writer(event: dict[str, Any], where: dict[str, list[tuple[str, int]]], verdict: Verdict) -> None:
    """A stream writer's session: what it sent is stored as a prefix, in order; all of it if the
    flush succeeded."""
    sent = event["d"]
    stored = [d in where for d in sent]
    kept = stored.index(False) if False in stored else len(sent)
    if any(stored[kept:]):
        verdict.anomaly("hole", f"{event['s']}: stream writer {event['sess']} stored {stored}")
    if event["e"] == "ok" and kept < len(sent):
        verdict.anomaly(
            "acknowledged-missing", f"{event['s']}: stream writer {event['sess']} flushed, {sent[kept]} missing"
        )
    offsets = [where[d][0][1] for d in sent[:kept]]
    if offsets != sorted(offsets):
        verdict.anomaly("out-of-order-write", f"{event['s']}: stream writer {event['sess']} at {offsets}")


def _check_readers(logs: dict[str, list[dict[str, Any]]], truth: Truth, verdict: Verdict) -> None:
    for events in logs.values():
        finished = any(e["e"] == "done" for e in events)
        sessions: dict[tuple[str, int], dict[str, Any]] = {}
        for event in events:
            key = (event.get("r"), event.get("n"))
            if event["e"] == "start":
                sessions[key] = {"path": event["s"], "next": event["frm"], "ended": False}
            elif key in sessions:
                _reader_event(sessions[key], key, event, truth, verdict)
        for (reader, n), session in sessions.items():
            if not session["ended"] and finished:
                verdict.anomaly("unfinished-session", f"{reader} session {n} on {session['path']}")


def _reader_event(
    session: dict[str, Any], key: tuple[str, int], event: dict[str, Any], truth: Truth, verdict: Verdict
) -> None:
    reader, n = key
    path = session["path"]
    where = f"{reader} session {n} on {path}"
    chunks = truth.chunks.get(path, {})
    if event["e"] == "chunks":
        offset, data = event["o"], event["d"]
        if offset > session["next"]:
            verdict.anomaly("delivery-gap", f"{where}: expected {session['next']}, got {offset}")
        elif offset < session["next"]:
            verdict.anomaly("delivered-twice", f"{where}: expected {session['next']}, got {offset} again")
        for i, d in enumerate(data):
            stored = chunks.get(offset + i)
            if stored is None:
                verdict.anomaly("unknown-offset", f"{where}: got {d} at {offset + i}, where nothing is stored")
            elif stored != d:
                verdict.anomaly("wrong-chunk", f"{where}: got {d} at {offset + i}, where {stored} is stored")
        verdict.delivered += len(data)
        session["next"] = offset + len(data)
    elif event["e"] == "offsets":
        verdict.anomaly("delivery-gap", f"{where}: offsets {event['got'][:20]} not consecutive")
    elif event["e"] == "jump":
        verdict.anomaly("bad-next-offset", f"{where}: after {event['frm']} told to go on at {event['to']}")
        session["next"] = event["to"]
    elif event["e"] == "end":
        session["ended"] = True
        how = event["how"]
        verdict.sessions[f"{reader.rsplit('/', 1)[-1].rstrip('0123456789')} {how}"] += 1
        if how == "end":
            final = truth.next_offsets.get(path, max(chunks, default=-1) + 1)
            if session["next"] != final:
                verdict.anomaly("ended-early", f"{where}: ended at {session['next']}, the stream has {final}")
        elif how in ("gone", "pruned"):
            if path not in truth.pruned:
                verdict.anomaly("false-gone", f"{where}: told {how} ({event}), but the stream was never pruned")
        elif how == "error":
            verdict.anomaly("reader-error", f"{where}: {event}")
