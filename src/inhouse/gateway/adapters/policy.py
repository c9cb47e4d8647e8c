"""Who may use an adapter: a key limited to some adapters (`keys create --adapters`), and a
key whose team is limited to some (`teams update --adapters`), are refused the others with
403. A key or team with no list may use every adapter; the base model a key may use is its
`--models` list's to say.

The team's list is read from the database on each request for an adapter, as the key is:
a change applies from the next request, on every replica sharing the database."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from inhouse.api.errors import APIError, permission_denied
from inhouse.gateway.keys import ApiKey
from inhouse.gateway.name_lists import Names, allows
from inhouse.gateway.usage.teams import TeamStore


def adapter_refused(adapter: str, whose: str) -> APIError:
    """The 403 for an adapter the key or its team may not use."""
    message = f"The adapter '{adapter}' is not among the adapters {whose} may use."
    return permission_denied(message, "adapter_not_allowed", "model")


@dataclass(frozen=True, slots=True)
class AdapterPolicy:
    """Checks a key's adapter against its own list and its team's."""

    teams: TeamStore
    local: bool  # the database answers inline (SQLite); else it is asked from a thread

    async def check(self, key: ApiKey, adapter: str | None) -> None:
        """Return if `key` may use `adapter` (None: the base model); else the 403."""
        if adapter is None:
            return
        if not key.may_use_adapter(adapter):
            raise adapter_refused(adapter, "this key")
        if not allows(await self._team_list(key), adapter):
            raise adapter_refused(adapter, f"the key's team {key.team!r}")

    async def usable(self, key: ApiKey, adapters: Iterable[str]) -> list[str]:
        """Those of `adapters` that `key` may use (what its `/v1/models` lists)."""
        team = await self._team_list(key)
        return [a for a in adapters if key.may_use_adapter(a) and allows(team, a)]

    async def _team_list(self, key: ApiKey) -> Names:
        if key.team is None:
            return None
        find = self.teams.find
        team = find(key.team) if self.local else await asyncio.to_thread(find, key.team)
        return None if team is None else team.adapters
