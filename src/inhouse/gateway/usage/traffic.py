"""What the audit says was served over a time range: requests, tokens and successful tasks.

A **successful task** is a generating request (chat or text completion) answered 200 whose
finish reason is `stop` or `tool_calls` (not cut off by `length`, not a content filter),
and that the same key did not send again with the same prompt (the same peppered
`prompt_hash`) within `retry_window_s` seconds: a retry says the first answer did not do.
"""

from __future__ import annotations

from sqlalchemy import Engine, and_, case, func, or_, select

from inhouse.cost.compare import Traffic
from inhouse.gateway.db import audit_log

GENERATING = ("chat/completions", "completions")
TASK_FINISHES = ("stop", "tool_calls")


def measured(db: Engine, since: float, until: float, retry_window_s: float) -> Traffic:
    """The traffic in `since <= ts < until`; a request near `until` is judged by the
    requests after it too (up to `retry_window_s` later)."""
    c = audit_log.c
    following = (
        func.lead(c.ts).over(partition_by=(c.key_name, c.prompt_hash), order_by=(c.ts, c.id))
    ).label("next_ts")
    window = (
        select(c.ts, c.status, c.finish_reason, c.prompt_hash, c.prompt_tokens,
               c.completion_tokens, following)
        .where(c.ts >= since, c.ts < until + retry_window_s, c.endpoint.in_(GENERATING))
        .subquery()
    )  # fmt: skip
    w = window.c
    answered = and_(w.ts < until, w.status == 200)
    not_retried = or_(
        w.prompt_hash.is_(None), w.next_ts.is_(None), w.next_ts - w.ts > retry_window_s
    )
    succeeded = and_(answered, w.finish_reason.in_(TASK_FINISHES), not_retried)
    in_range = w.ts < until
    query = select(
        func.coalesce(func.sum(case((answered, 1), else_=0)), 0),
        func.coalesce(func.sum(case((in_range, w.prompt_tokens), else_=0)), 0),
        func.coalesce(func.sum(case((in_range, w.completion_tokens), else_=0)), 0),
        func.coalesce(func.sum(case((succeeded, 1), else_=0)), 0),
    )
    with db.connect() as conn:
        requests, prompt, completion, tasks = conn.execute(query).one()
    return Traffic(until - since, int(requests), int(prompt), int(completion), int(tasks))
