"""`inhouse plan --emit ENGINE`: a plan as one engine's launch command, with what it lacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inhouse.launch import ENGINES
from inhouse.launch.base import Flags, shell_line
from inhouse.launch.inhouse import planned_path
from inhouse.launch.settings import settings_from_plan
from inhouse.plan.planner import Plan

if TYPE_CHECKING:
    from rich.console import Console

# The JSON key of each engine's flags (the first two as `inhouse plan --json` always had them).
JSON_KEYS = {
    "inhouse": "inhouse_serve",
    "vllm": "vllm_serve",
    "llama.cpp": "llama_server",
    "sglang": "sglang_launch_server",
}


def plan_flags(engine: str, plan: Plan) -> Flags:
    """The model and plan flags of `engine` for this plan, and its notes."""
    return ENGINES[engine].flags(settings_from_plan(plan))


def flags_json(plan: Plan) -> dict[str, object]:
    """Each engine's plan flags (without the model), notes and environment, for
    `inhouse plan --json`; None for each engine when the plan does not fit."""
    if not plan.fits:
        return dict.fromkeys(JSON_KEYS.values())
    settings = settings_from_plan(plan)
    out: dict[str, object] = {}
    notes: dict[str, list[str]] = {}
    env: dict[str, dict[str, str]] = {}
    for name, key in JSON_KEYS.items():
        engine = ENGINES[name]
        flags = engine.flags(settings)
        out[key] = flags.argv[len(engine.model_args(settings)) :]
        notes[name] = flags.notes
        env[name] = flags.env
    return {**out, "notes": notes, "env": env}


LOOPBACK = "127.0.0.1"  # where an emitted server with a --port listens: the gateway's host


def emit(engine: str, plan: Plan, port: int | None = None) -> str:
    """A shell snippet: each setting the engine cannot take as a comment, then its command
    (listening on 127.0.0.1:`port` when given, else on the engine's default address)."""
    flags = plan_flags(engine, plan)
    if port is not None:
        ENGINES[engine].address_flags(LOOPBACK, port, flags)
    notes = [f"# {note}" for note in flags.notes]
    return "\n".join([*notes, shell_line(ENGINES[engine].program, flags.argv, flags.env)])


def print_recommended(plan: Plan, console: Console) -> None:
    """The report's closing part: inhouse's and vLLM's command for a plan that fits."""
    console.print("\n[bold]Recommended flags[/] (max-num-seqs ≈ 80% of capacity):")
    for engine in ("inhouse", "vllm"):
        console.file.write(emit(engine, plan) + "\n")  # never wrapped
    if (path := planned_path(plan)) is not None:
        console.print(
            f"[dim]inhouse serve on a CPU takes its own fastest path, so no --dtype: "
            f"{path.quantization} weights, {path.dtype} activations ({path.reason}).[/]",
            soft_wrap=True,
        )
    console.print("[dim]llama.cpp and SGLang: --emit llama.cpp, --emit sglang[/]")
