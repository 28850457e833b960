"""The results page and the README's short table are what ``pgstreams_bench --results`` makes of
the reports in docs/results/: no figure on either differs from the reports, and each report
says how it was made."""

from __future__ import annotations

import pytest

from bench import results


def test_the_results_page_is_made_from_the_reports() -> None:
    assert results.PAGE.read_text() == results.page()  # else: python manage.py pgstreams_bench --results


def test_the_readmes_table_is_made_from_the_reports() -> None:
    made = results.FRONT.search(results.README.read_text())
    assert made, "the README has lost its <!-- results --> block"
    assert made[0] == made[1] + results.front() + made[2]


@pytest.mark.parametrize("kind", [kind.name for kind in results.KINDS])
def test_each_report_says_how_it_was_made(kind: str) -> None:
    report = results.reports().get(kind)
    if report is None:
        pytest.skip(f"no docs/results/{kind}.json yet")
    run = report["run"]
    program = "pgstreams_soak" if kind == "soak" else "pgstreams_bench"
    assert run["kind"] == kind and run["command"].startswith(f"python manage.py {program} ")
    assert "--json docs/results/" in run["command"] and run["commit"] != "unknown" and run["date"]
