"""Reply-parser cost per streamed piece over 32k-token replies: it must not grow with the reply.

Feeds each reply (long prose, whitespace runs, a call with long arguments, long reasoning, repeated
tag prefixes) in 4-character pieces through the think + hermes parser and compares the cost per piece
in the first and last tenth. A ratio over 2 means some per-piece work scales with the reply (FAIL).

    .venv/bin/python -m bench.parsers [--tokens 32000]
"""

from __future__ import annotations

import argparse
import time

from app.parsers import ReplyParser


def replies(n_chars: int) -> dict[str, str]:
    return {
        "prose": "word " * (n_chars // 5),
        "spaces": "a" + " " * n_chars + "b",
        "newlines": "a" + "\n" * n_chars + "b",
        "call_args": '<tool_call>\n{"name": "write", "arguments": {"text": "' + "x" * n_chars + '"}}\n</tool_call>',
        "call_spaces": '<tool_call>\n{"name": "write", "arguments": {"text": "a"' + " " * n_chars + "}}\n</tool_call>",
        "reasoning": "<think>" + "hmm " * (n_chars // 4) + "</think>answer",
        "tag_prefixes": "<tool_ca" * (n_chars // 8),
    }


def per_piece_us(text: str, size: int = 4) -> tuple[float, float, int]:
    parser = ReplyParser(reasoning="think", tools="hermes", tool_names=frozenset({"write"}))
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    tenth = len(pieces) // 10
    marks = [time.perf_counter()]
    for chunk in (pieces[:tenth], pieces[tenth:-tenth], pieces[-tenth:]):
        for piece in chunk:
            parser.feed(piece)
        marks.append(time.perf_counter())
    parser.finish()
    return 1e6 * (marks[1] - marks[0]) / tenth, 1e6 * (marks[3] - marks[2]) / tenth, len(pieces)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32000, help="reply length in ~4-character tokens")
    ns = ap.parse_args()
    print(f"{'reply':14s} {'pieces':>7s} {'first 10%':>10s} {'last 10%':>10s}  (us per piece)")
    for name, text in replies(ns.tokens * 4).items():
        first, last, n = per_piece_us(text)
        verdict = "FAIL" if last > 2 * max(first, 1.0) else "ok"
        print(f"{name:14s} {n:7d} {first:10.1f} {last:10.1f}  {verdict}")


if __name__ == "__main__":
    main()
