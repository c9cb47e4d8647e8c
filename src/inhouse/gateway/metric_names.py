"""The names of the gateway's metrics that something outside the gateway reads by name: the
autoscaling rules and panels (`observe`) and a cluster autoscaler (`deploy/kubernetes`)."""

from __future__ import annotations

QUEUE_DEPTH = "inhouse:gateway_queue_depth"  # requests waiting for a replica (gauge)
REPLICAS = "inhouse:replicas"  # replicas routed to, not draining (gauge)
REPLICAS_MAX = "inhouse:replicas_max"  # `inhouse up --replicas MIN:MAX`'s MAX (gauge)
SCALE_EVENTS = "inhouse:scale_events"  # replicas started or drained (counter: `_total`)
# (direction, reason) of a scale event: the signal that held for its window (up: in
# scale_policy.high_reason's order)
SCALE_REASONS = (("up", "queue"), ("up", "waiting"), ("up", "kv_cache"), ("up", "ttft"),
                 ("down", "low_load"))  # fmt: skip
