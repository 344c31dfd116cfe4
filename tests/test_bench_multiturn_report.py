"""S12's figures (bench/multiturn_report.py), from made-up records: percentiles, the reused
share, the affinity mix, each server's busy time, the targets as the issue words them, and
the Markdown tables with both controls."""

from __future__ import annotations

from typing import Any

from bench import multiturn_report as report
from bench import multiturn_texts as texts


def rec(user: int, turn: int, ttft: float, served: str = "a", affinity: str | None = "hit",
        prompt: int = 100, cached: int = 50, start: float = 0.0, end: float = 1.0,
        **more: Any) -> dict[str, Any]:
    return {"user": user, "turn": turn, "status": 200, "done": True, "ttft_s": ttft,
            "total_s": end - start, "served_by": served, "affinity": affinity,
            "prompt_tokens": prompt, "cached_tokens": cached, "error": None, "start": start,
            "end": end, **more}


def test_percentile_interpolates() -> None:
    assert report.percentile([], 0.5) is None
    assert report.percentile([3.0], 0.9) == 3.0
    assert report.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert report.percentile([float(x) for x in range(11)], 0.9) == 9.0


def test_measure_counts_later_turns_only() -> None:
    records = [rec(0, 1, 9.0, cached=0, affinity="miss"), rec(0, 2, 1.0), rec(0, 3, 3.0),
               {**rec(1, 2, 0.0), "status": 502, "done": False, "ttft_s": None}]
    f = report.measure(records)
    assert (f["measured"], f["answered"]) == (3, 2)
    assert f["ttft_p50_s"] == 2.0
    assert f["reused_share"] == 0.5
    assert f["affinity"] == {"hit": 3}
    assert [x["user"] for x in f["failed"]] == [1]
    everything = report.measure(records, later_only=False)
    assert everything["affinity"] == {"miss": 1, "hit": 3}


def test_busy_is_the_union_of_each_servers_requests() -> None:
    records = [rec(0, 1, 1, "a", start=0, end=4), rec(1, 1, 1, "a", start=2, end=6),
               rec(2, 1, 1, "b", start=8, end=9)]
    got = report.busy(records, 10.0)
    assert got == {"a": {"requests": 2, "request_share": 0.667, "busy_share": 0.6},
                   "b": {"requests": 1, "request_share": 0.333, "busy_share": 0.1}}


def tables(ca: tuple[float, float], oracle: tuple[float, float], users: int
           ) -> dict[str, Any]:
    figures = {name: {"ttft_p50_s": p50, "ttft_p90_s": p90, "reused_share": 0.9,
                      "affinity": {"hit": 4}, "answered": 4, "measured": 4}
               for name, (p50, p90) in (("oracle", oracle), ("cache-aware", ca))}
    return report.strategy_table(users, 5, figures)


def test_targets_as_the_issue_words_them() -> None:
    four = tables((1.19, 1.2), (1.0, 1.0), 4)
    eight = tables((1.0, 1.01), (1.0, 1.0), 8)
    assert four["by_strategy"]["cache-aware"]["p90_vs_oracle"] == 1.2
    controls = {
        "negative": {"users": 4, "requests": 3, "by_strategy": {
            "least-loaded": {"ttft_p50_s": 2.0, "ttft_p90_s": 3.0, "reused_share": 0.0,
                             "affinity": {"None": 12}},
            "cache-aware": {"ttft_p50_s": 2.1, "ttft_p90_s": 3.2, "reused_share": 0.0,
                            "affinity": {"miss": 12}}}},
        "hotspot": {"strategy": "cache-aware", "fan_out": 3, "others": 1, "hot_share": 0.75,
                    "requests": 24, "wall_s": 30.0,
                    "servers": {"a": {"requests": 14, "request_share": 0.583,
                                      "busy_share": 0.9},
                                "b": {"requests": 10, "request_share": 0.417,
                                      "busy_share": 0.4}}}}
    met = report.judge([four, eight], controls)
    assert met == {"4 users": True, "8 users": False, "negative": False, "hotspot": False}
    md = report.markdown([four, eight], controls, met, 1)
    assert "| 4 x 5 | cache-aware | 1.19 s | 1.20 s | 1.19x | 1.20x | 90% | hit 4 | 4/4 |" in md
    assert "| least-loaded | 2.00 s | 3.00 s | 0% | none 12 |" in md
    assert "| b | 10 | 42% | 40% |" in md
    assert "8 users: MISSED" in md
    assert "4 users: met" in md


def test_texts_are_deterministic_and_sized() -> None:
    assert texts.system_prompt() == texts.system_prompt()
    assert 330 <= len(texts.system_prompt().split()) <= 380
    assert 240 <= len(texts.document(3).split()) <= 280
    assert texts.document(3) != texts.document(4)
    chat = texts.Conversation(2)
    first = chat.ask()
    assert first[0]["content"] == texts.system_prompt()
    assert first[1]["content"].startswith(texts.document(2))
    chat.answered(first, "An answer.")
    second = chat.ask()
    assert second[:3] == [*first, {"role": "assistant", "content": "An answer."}]
    assert 35 <= len(second[3]["content"].split()) <= 50
    assert chat.ask(1)[-1] != second[-1]  # the hotspot's fan-out asks other questions
    assert texts.fresh("1-1")[0]["content"] != texts.fresh("1-2")[0]["content"]
