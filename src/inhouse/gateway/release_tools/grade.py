"""`inhouse release compare MODEL --grade EVALSET`: the stored shadow answers graded with an
eval set's graders, the stable's against the candidate's on the same requests.

A pair is graded when its request asked one of the set's items, told by the peppered
prompt hash the audit log keeps (the model and the item's messages or prompt, as `inhouse
eval` sends them: run it at the gateway with a key that logs content while the candidate is
shadowed), and both answers were stored (keys that log content; the stored texts are
graded, redacted as stored). Nothing is asked again: the answers graded are the ones
people's traffic got. Items graded on tool calls are counted apart and left out, since a
pair keeps the text only (their validity is in the tool-call figures).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, select

from inhouse.eval.graders import Answer, grade
from inhouse.eval.items import EvalItem
from inhouse.eval.stats import PairedDifference, Proportion, paired_difference, wilson
from inhouse.gateway.db import shadow_pairs
from inhouse.gateway.releases.figures import MAX_ROWS
from inhouse.gateway.settlement import asked


@dataclass(frozen=True, slots=True)
class Grading:
    """The graded pairs: each release's accuracy and the paired difference."""

    items: int  # in the eval set
    matched_items: int  # items with at least one graded pair
    pairs: int
    tool_call_pairs: int  # matched to `tool_call` items: not gradable from stored text
    stable: Proportion
    candidate: Proportion
    paired: PairedDifference  # candidate minus stable
    right_to_wrong: list[str]  # ids of items whose answer the candidate got wrong
    wrong_to_right: list[str]


def grade_pairs(
    db: Engine, hash_of: Callable[[str], str], model: str, release: int, items: list[EvalItem]
) -> Grading:
    """Grade the newest `MAX_ROWS` stored pairs of `release` that asked one of `items`."""
    by_hash = {hash_of(asked(model, item.messages or item.prompt)): item for item in items}
    c = shadow_pairs.c
    stored = (c.primary_text.is_not(None), c.shadow_text.is_not(None))
    query = (
        select(c.prompt_hash, c.primary_text, c.shadow_text)
        .where(c.model == model, c.shadow_release == release, c.prompt_hash.is_not(None))
        .where(c.primary_status == 200, c.shadow_status == 200, *stored)
        .order_by(c.id.desc())
        .limit(MAX_ROWS)
    )
    with db.connect() as conn:
        rows = [r for r in conn.execute(query) if r.prompt_hash in by_hash]
    graded: list[tuple[str, bool, bool]] = []
    tool_calls = 0
    for row in rows:
        item = by_hash[row.prompt_hash]
        if item.grader == "tool_call":
            tool_calls += 1
            continue
        right = grade(item, Answer(row.primary_text)), grade(item, Answer(row.shadow_text))
        graded.append((item.id, *right))
    right_to_wrong = [i for i, a, b in graded if a and not b]
    wrong_to_right = [i for i, a, b in graded if b and not a]
    return Grading(
        items=len(items),
        matched_items=len({i for i, _, _ in graded}),
        pairs=len(graded),
        tool_call_pairs=tool_calls,
        stable=wilson(sum(a for _, a, _ in graded), len(graded)),
        candidate=wilson(sum(b for _, _, b in graded), len(graded)),
        paired=paired_difference(len(graded), len(right_to_wrong), len(wrong_to_right)),
        right_to_wrong=sorted(set(right_to_wrong)),
        wrong_to_right=sorted(set(wrong_to_right)),
    )
