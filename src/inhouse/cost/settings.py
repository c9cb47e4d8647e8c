"""The `[cost]` section of the gateway's TOML: what the hardware costs (owned or rented),
the hosted API it is compared with, and what team budgets are charged per token."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

DAYS_PER_MONTH = 30.0


class CostConfigError(ValueError):
    """The `[cost]` section is invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class TokenPrices:
    """Prices per million input and output tokens."""

    input_per_million: float = 0.0
    output_per_million: float = 0.0

    def of(self, prompt_tokens: float, completion_tokens: float) -> float:
        """What these tokens cost at these prices."""
        return (
            prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million
        ) / 1e6


@dataclass(frozen=True, slots=True)
class Owned:
    """Hardware bought once: written off over `amortisation_months`, drawing `watts` around
    the clock (an idle GPU still costs), run by an operator `operator_hours_per_month`."""

    price: float = 0.0
    amortisation_months: float = 36.0
    watts: float = 0.0
    price_per_kwh: float = 0.0
    operator_hours_per_month: float = 0.0
    operator_rate: float = 0.0

    def per_day(self) -> float:
        hardware = self.price / self.amortisation_months / DAYS_PER_MONTH
        power = self.watts / 1000 * 24 * self.price_per_kwh
        people = self.operator_hours_per_month * self.operator_rate / DAYS_PER_MONTH
        return hardware + power + people


@dataclass(frozen=True, slots=True)
class Rented:
    """GPUs rented by the hour, around the clock."""

    gpu_hourly: float = 0.0
    gpus: int = 1

    def per_day(self) -> float:
        return self.gpu_hourly * self.gpus * 24


@dataclass(frozen=True, slots=True)
class CostSettings:
    """Everything `inhouse cost` and team money budgets need."""

    currency: str = ""
    owned: Owned | None = None
    rented: Rented | None = None
    hosted: TokenPrices = field(default_factory=TokenPrices)
    charge: TokenPrices | None = None  # what a team's money budget is charged; else `hosted`
    retry_window_s: float = 60.0  # a same-prompt request within this long is a retry
    capacity_tokens_per_s: float | None = None  # what `inhouse plan` says the hardware serves

    def per_day(self) -> float:
        """What the self-hosted side costs a day, used or not."""
        return sum(side.per_day() for side in (self.owned, self.rented) if side is not None)

    @property
    def charged(self) -> TokenPrices:
        return self.charge if self.charge is not None else self.hosted


def load_cost(path: str | Path) -> CostSettings:
    """The `[cost]` section of a TOML file (nothing else in it is read)."""
    with open(path, "rb") as f:
        raw = tomllib.load(f).get("cost", {})
    if not isinstance(raw, dict):
        raise CostConfigError("[cost] must be a table")
    return parse_cost(raw)


def parse_cost(raw: dict[str, Any]) -> CostSettings:
    """Validate a parsed `[cost]` table (every number finite and >= 0)."""
    tables = {"owned": Owned, "rented": Rented, "hosted": TokenPrices, "charge": TokenPrices}
    plain = {"currency", "retry_window_s", "capacity_tokens_per_s"}
    _reject_unknown(raw, "cost", plain | set(tables))
    values: dict[str, Any] = {}
    for name, kind in tables.items():
        if name in raw:
            values[name] = _section(raw[name], f"cost.{name}", kind)
    if "currency" in raw:
        values["currency"] = str(raw["currency"])
    for name in ("retry_window_s", "capacity_tokens_per_s"):
        if name in raw:
            values[name] = _number(raw[name], f"cost.{name}")
    return CostSettings(**values)


def _section(raw: Any, where: str, kind: type) -> Any:
    if not isinstance(raw, dict):
        raise CostConfigError(f"[{where}] must be a table")
    known = {f.name for f in fields(kind)}
    _reject_unknown(raw, where, known)
    values = {k: _number(v, f"{where}.{k}") for k, v in raw.items()}
    if values.get("amortisation_months", 1) == 0:
        raise CostConfigError(f"{where}.amortisation_months must be > 0")
    if "gpus" in values:
        values["gpus"] = int(values["gpus"])
    return kind(**values)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CostConfigError(f"{where} must be a number, got {value!r}")
    if value < 0:
        raise CostConfigError(f"{where} must be >= 0, got {value!r}")
    return float(value)


def _reject_unknown(table: dict[str, Any], where: str, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise CostConfigError(f"unknown key(s) in [{where}]: {', '.join(unknown)}")
