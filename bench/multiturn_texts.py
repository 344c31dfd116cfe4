"""S12's conversation texts, deterministic (a seeded ``random.Random`` per text): a system
prompt every conversation shares (~350 words), a private document per user (~250 words),
turns of ~40 words (each ``scale`` times that: the smoke run's are a tenth); and the bodies
of each turn, the history re-sent every time, as chat apps and agents do. Standard library
only."""

from __future__ import annotations

import json
import random
from typing import Any

MODEL = "smol"
SYSTEM_WORDS = 350
DOC_WORDS = 250
TURN_WORDS = 40

NOUNS = ("baker", "river", "garden", "ledger", "window", "harbour", "lantern", "meadow",
         "engine", "kettle", "market", "violin", "tunnel", "orchard", "pencil", "signal",
         "bridge", "saddle", "beacon", "furnace", "library", "compass", "quarry", "pigeon",
         "cellar", "anchor", "basket", "canyon", "ribbon", "tractor", "glacier", "parcel",
         "ferry", "thistle", "furnace", "mirror", "ladder", "sparrow", "wagon", "harvest")
VERBS = ("carries", "repairs", "watches", "follows", "paints", "counts", "measures",
         "guards", "borrows", "polishes", "describes", "collects", "delivers", "visits",
         "records", "sorts", "questions", "lifts", "shelters", "remembers")
ADJECTIVES = ("quiet", "copper", "narrow", "early", "heavy", "golden", "patient", "crooked",
              "silver", "distant", "woollen", "bright", "hollow", "northern", "careful",
              "ancient", "humble", "frozen", "restless", "gentle")
PLACES = ("near the station", "behind the mill", "under the old oak", "by the south gate",
          "across the square", "beside the canal", "at the top of the hill",
          "inside the warehouse", "along the harbour wall", "past the chapel")
ASKS = ("Tell me briefly what the document says about", "In one sentence, who looks after",
        "Summarise what happens to", "What do we learn about", "Explain in a few words where",
        "Which detail of the notes mentions")


def _sentence(rng: random.Random) -> list[str]:
    words = ["The", rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(VERBS), "the",
             rng.choice(ADJECTIVES), rng.choice(NOUNS), *rng.choice(PLACES).split()]
    if rng.random() < 0.5:
        words += ["while", "the", rng.choice(NOUNS), rng.choice(VERBS), "a",
                  rng.choice(NOUNS)]
    words[-1] += "."
    return words


def prose(seed: str, words: int) -> str:
    """About ``words`` words of plain sentences, the same for the same ``seed``."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < words:
        out += _sentence(rng)
    return " ".join(out)


def _n(words: int, scale: float) -> int:
    return max(8, round(words * scale))


def system_prompt(seed: str = "shared", scale: float = 1.0) -> str:
    rules = ("You are the archivist of a small harbour town. Answer the user's questions "
             "about the town's records in one or two short sentences, using only what the "
             "records and the user's documents say. Background records follow. ")
    return rules + prose(f"system-{seed}", _n(SYSTEM_WORDS - len(rules.split()), scale))


def document(user: int, seed: str = "doc", scale: float = 1.0) -> str:
    return f"My notes, file {user}: " + prose(f"{seed}-{user}", _n(DOC_WORDS, scale))


def question(user: int, turn: int, seed: str = "turn", scale: float = 1.0) -> str:
    rng = random.Random(f"{seed}-{user}-{turn}")
    about = f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
    context = prose(f"{seed}-ctx-{user}-{turn}", _n(TURN_WORDS - 12, scale))
    return f"{context} {rng.choice(ASKS)} {about}, and why it matters for file {user}?"


class Conversation:
    """One user's chat: the system prompt, the document with the first question, then one
    question per turn; :meth:`body` is the request of the next turn (the whole history),
    :meth:`answered` appends the model's answer."""

    def __init__(self, user: int, scale: float = 1.0, seed: str = "turn") -> None:
        self.user = user
        self.seed = seed
        self.scale = scale
        system, doc = system_prompt(scale=scale), document(user, scale=scale)
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        self.doc = doc
        self.turn = 0

    def __repr__(self) -> str:
        return f"Conversation(user={self.user}, turn={self.turn})"

    def ask(self, variant: int = 0) -> list[dict[str, str]]:
        """The messages of the next turn (a ``variant`` > 0 asks another question on the
        same history: the hotspot's fan-out)."""
        text = question(self.user, self.turn + 1, f"{self.seed}-v{variant}" if variant
                        else self.seed, self.scale)
        if self.turn == 0:
            text = f"{self.doc}\n\n{text}"
        return [*self.messages, {"role": "user", "content": text}]

    def answered(self, asked: list[dict[str, str]], answer: str) -> None:
        self.messages = [*asked, {"role": "assistant", "content": answer or "(no answer)"}]
        self.turn += 1


def fresh(seed: str, scale: float = 1.0) -> list[dict[str, str]]:
    """A conversation nobody has seen and that shares no prefix with any other: its own
    system prompt and document, of the usual sizes (the negative control)."""
    system = prose(f"neg-sys-{seed}", _n(SYSTEM_WORDS, scale))
    return [{"role": "system", "content": f"Case {seed}. {system}"},
            {"role": "user", "content": prose(f"neg-doc-{seed}", _n(DOC_WORDS, scale)) + " "
             + question(0, 1, f"neg-{seed}", scale)}]


def body(messages: list[dict[str, str]], max_tokens: int) -> bytes:
    doc: dict[str, Any] = {"model": MODEL, "messages": messages, "stream": True,
                           "max_tokens": max_tokens, "temperature": 0,
                           "stream_options": {"include_usage": True}}
    return json.dumps(doc).encode()
