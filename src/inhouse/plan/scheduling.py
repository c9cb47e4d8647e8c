"""The engine's scheduling policies as the plan names them: the policies themselves (the
order a step offers its budget in, tenants' shares, background rows) live in
``inhouse.scheduling``, which the engine's scheduler and the simulation
(`inhouse.plan.sim_engine`) both call."""

from __future__ import annotations

from inhouse.plan.errors import PlanError
from inhouse.scheduling.policy import POLICIES


def check_policy(policy: str) -> str:
    """The policy's name, or a PlanError listing the known ones."""
    if policy not in POLICIES:
        raise PlanError(f"the scheduling policy is one of {', '.join(POLICIES)}, not {policy!r}")
    return policy
