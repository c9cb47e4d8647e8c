"""`inhouse bench run` and `inhouse bench sweep`: options in, a session out.

Only typer and small modules load with the module; httpx, rich, matplotlib and the bench's own
modules load when a command runs (start-up time of every `inhouse` command).
"""

from __future__ import annotations

import asyncio
import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from inhouse.plan.errors import PlanError

if TYPE_CHECKING:
    from inhouse.bench.settings import SessionSettings

bench_app = typer.Typer(
    help="Check the plan against reality: drive an OpenAI-compatible endpoint and measure it.",
    no_args_is_help=True,
)


class DatasetChoice(StrEnum):
    random = "random"
    jsonl = "jsonl"
    shared_prefix = "shared-prefix"
    random_mm = "random-mm"


class EndpointChoice(StrEnum):
    chat = "chat"
    completions = "completions"


BaseUrl = Annotated[
    str, typer.Option(help="Server root or its /v1 URL, any OpenAI-compatible host.")
]
Model = Annotated[str, typer.Option(help="Model name as the server lists it in /v1/models.")]
ApiKey = Annotated[
    str | None, typer.Option(envvar="INHOUSE_API_KEY", help="Bearer key, if the server wants one.")
]
Dataset = Annotated[
    DatasetChoice,
    typer.Option(help="random, jsonl (real prompts), shared-prefix or random-mm (with images)."),
]
DatasetPath = Annotated[
    Path | None, typer.Option(help="JSONL file: {messages} or {prompt} per line.")
]
EndpointOpt = Annotated[EndpointChoice, typer.Option(help="API for random/shared-prefix prompts.")]
InputLen = Annotated[
    int, typer.Option(help="Mean prompt tokens (the question, for shared-prefix).")
]
OutputLen = Annotated[int, typer.Option(help="Mean max_tokens per request.")]
LenSpread = Annotated[float, typer.Option(help="Lengths uniform in mean·(1±spread).")]
PrefixLen = Annotated[int, typer.Option(help="shared-prefix: tokens of the common system prompt.")]
NumQuestions = Annotated[int, typer.Option(help="shared-prefix: distinct questions behind it.")]
NumPrefixes = Annotated[
    int, typer.Option(help="shared-prefix: distinct prompts (documents), each asked them all.")
]
MetricsUrl = Annotated[
    list[str] | None,
    typer.Option(help="A server whose /metrics to read (once per replica behind a gateway)."),
]
Warmup = Annotated[int, typer.Option(help="Unmeasured requests first (cold p99 TTFT misleads).")]
Timeout = Annotated[float, typer.Option(help="Seconds one request may take before it fails.")]
Seed = Annotated[int, typer.Option(help="Seed for prompts and arrivals, so runs repeat.")]
Temperature = Annotated[float, typer.Option(help="Sampling temperature sent with each request.")]
IgnoreEos = Annotated[
    bool, typer.Option(help="Send ignore_eos (vLLM extension) so answers run to max_tokens.")
]
Out = Annotated[Path | None, typer.Option(help="Folder for results.json (and a sweep's PNGs).")]


def _settings(
    *,
    base_url: str,
    model: str,
    api_key: str | None,
    dataset: DatasetChoice,
    dataset_path: Path | None,
    endpoint: EndpointChoice,
    input_len: int,
    output_len: int,
    len_spread: float,
    prefix_len: int,
    num_questions: int,
    num_prefixes: int,
    metrics_url: list[str] | None,
    warmup: int,
    timeout: float,
    seed: int,
    slo: str | None,
    temperature: float,
    ignore_eos: bool,
    out: Path | None,
    images_per_prompt: int = 1,
    image_size: str = "512x512",
    **load_options: object,
) -> SessionSettings:
    """The options both commands share, checked; `load_options` are each command's own."""
    from inhouse.bench.metrics import parse_slo
    from inhouse.bench.settings import (
        DatasetSettings,
        EndpointSettings,
        SessionSettings,
        SettingsError,
    )
    from inhouse.plan.errors import PlanError
    from inhouse.plan.vision import parse_image_size

    try:
        return SessionSettings(
            endpoint=EndpointSettings(
                base_url=base_url,
                model=model,
                api_key=api_key,
                timeout=timeout,
                temperature=temperature,
                ignore_eos=ignore_eos,
            ),
            dataset=DatasetSettings(
                kind=dataset.value,
                path=dataset_path,
                endpoint=endpoint.value,
                input_len=input_len,
                output_len=output_len,
                len_spread=len_spread,
                prefix_len=prefix_len,
                num_questions=num_questions,
                num_prefixes=num_prefixes,
                images_per_prompt=images_per_prompt,
                image_size=parse_image_size(image_size),
            ),
            slo=parse_slo(slo or ""),
            seed=seed,
            warmup=warmup,
            out=out,
            metrics_urls=tuple(metrics_url or ()),
        )
    except (SettingsError, ValueError, PlanError) as exc:
        raise typer.BadParameter(str(exc)) from exc


def _session(coroutine_factory) -> None:  # type: ignore[no-untyped-def]
    """Run a session; endpoint and dataset problems end it with one clear line and exit 2."""
    from inhouse.bench.datasets import DatasetError
    from inhouse.bench.preflight import EndpointError

    try:
        asyncio.run(coroutine_factory())
    except (EndpointError, DatasetError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@bench_app.command("run")
def run(
    base_url: BaseUrl,
    model: Model,
    api_key: ApiKey = None,
    dataset: Dataset = DatasetChoice.random,
    dataset_path: DatasetPath = None,
    endpoint: EndpointOpt = EndpointChoice.chat,
    input_len: InputLen = 256,
    output_len: OutputLen = 128,
    len_spread: LenSpread = 0.0,
    prefix_len: PrefixLen = 1024,
    num_questions: NumQuestions = 16,
    num_prefixes: NumPrefixes = 1,
    metrics_url: MetricsUrl = None,
    num_prompts: Annotated[int | None, typer.Option(help="Requests to send (default 100).")] = None,
    images_per_prompt: Annotated[
        int, typer.Option(help="random-mm: images after each prompt's text.")
    ] = 1,
    image_size: Annotated[
        str, typer.Option(help="random-mm: the images' WIDTHxHEIGHT in pixels.")
    ] = "512x512",
    max_concurrency: Annotated[
        int | None, typer.Option(help="Closed loop: this many in flight (caps --request-rate).")
    ] = None,
    request_rate: Annotated[
        float | None, typer.Option(help="Open loop: Poisson arrivals per second.")
    ] = None,
    burstiness: Annotated[float, typer.Option(help="Gamma shape of arrivals: 1 Poisson.")] = 1.0,
    duration: Annotated[float | None, typer.Option(help="Stop issuing after seconds.")] = None,
    warmup: Warmup = 2,
    timeout: Timeout = 300.0,
    seed: Seed = 0,
    slo: Annotated[
        str | None, typer.Option(help="Goodput objectives: ttft=500ms,tpot=50ms.")
    ] = None,
    temperature: Temperature = 0.0,
    ignore_eos: IgnoreEos = False,
    out: Out = None,
    mix: Annotated[
        list[str] | None,
        typer.Option(
            help="A traffic class, once per class (2 or more), all driven at once and reported "
            "apart: 'NAME: max-concurrency=N, input-len=N, output-len=N, num-prompts=N "
            "(or duration=S; neither: background), delay=S, priority=N, api-key-env=VAR, "
            "cache-salt=TENANT'."
        ),
    ] = None,
) -> None:
    """Drive the endpoint once and report TTFT, TPOT, ITL, E2E, throughput and goodput."""
    from rich.console import Console

    from inhouse.bench.loadgen import LoadShape
    from inhouse.bench.session import bench_run

    options = dict(locals())
    options.pop("mix")
    settings = _settings(**options)
    if mix:
        _mix(settings, mix, max_concurrency, request_rate, num_prompts, duration)
        return
    if max_concurrency is None and request_rate is None:
        raise typer.BadParameter("give --max-concurrency (closed loop) or --request-rate (open)")
    if num_prompts is None and duration is None:
        num_prompts = 100
    try:
        shape = LoadShape(
            max_concurrency=max_concurrency,
            request_rate=request_rate,
            burstiness=burstiness,
            num_prompts=num_prompts,
            duration=duration,
            seed=seed,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _session(lambda: bench_run(settings, shape, Console()))


def _mix(
    settings: SessionSettings,
    mix: list[str],
    max_concurrency: int | None,
    request_rate: float | None,
    num_prompts: int | None,
    duration: float | None,
) -> None:
    """`bench run --mix`: the classes carry the load shape, so the run-wide one is refused."""
    from rich.console import Console

    from inhouse.bench.mix import parse_mix
    from inhouse.bench.mix_run import bench_mix
    from inhouse.bench.settings import SettingsError

    given = {
        "--max-concurrency": max_concurrency,
        "--request-rate": request_rate,
        "--num-prompts": num_prompts,
        "--duration": duration,
    }
    clashing = [name for name, value in given.items() if value is not None]
    if clashing:
        raise typer.BadParameter(f"--mix gives each class its own load: drop {', '.join(clashing)}")
    try:
        dataset = settings.dataset
        classes = parse_mix(mix, input_len=dataset.input_len, output_len=dataset.output_len)
        for spec in classes:
            spec.api_key(settings.endpoint.api_key)  # an unset variable fails before sending
    except SettingsError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _session(lambda: bench_mix(settings, classes, Console()))


@bench_app.command("sweep")
def sweep(
    base_url: BaseUrl,
    model: Model,
    api_key: ApiKey = None,
    dataset: Dataset = DatasetChoice.random,
    dataset_path: DatasetPath = None,
    endpoint: EndpointOpt = EndpointChoice.chat,
    input_len: InputLen = 256,
    output_len: OutputLen = 128,
    len_spread: LenSpread = 0.0,
    prefix_len: PrefixLen = 1024,
    num_questions: NumQuestions = 16,
    num_prefixes: NumPrefixes = 1,
    metrics_url: MetricsUrl = None,
    steps: Annotated[str | None, typer.Option(help="Concurrency steps, e.g. 1,2,4,8.")] = None,
    max_concurrency: Annotated[
        int | None, typer.Option(help="Double from 1 until at least this (and 2× the plan).")
    ] = None,
    plan: Annotated[
        str | None,
        typer.Option(help="`inhouse plan --json` output file, or a model name to plan with --gpu."),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(help="GPU to plan for when --plan names a model.")
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(help="`inhouse bench calibrate` profile: draw the predicted curves too."),
    ] = None,
    prompts_per_slot: Annotated[int, typer.Option(help="Requests per concurrent slot.")] = 4,
    min_prompts: Annotated[int, typer.Option(help="Fewest requests at any step.")] = 8,
    warmup: Warmup = 2,
    timeout: Timeout = 300.0,
    seed: Seed = 0,
    slo: Annotated[
        str, typer.Option(help="The knee is where p99 TTFT exceeds ttft=….")
    ] = "ttft=2s",
    temperature: Temperature = 0.0,
    ignore_eos: IgnoreEos = False,
    out: Out = None,
) -> None:
    """Step concurrency up past the plan's prediction and name the knee: the real capacity."""
    from rich.console import Console

    from inhouse.bench.planref import PlanReferenceError, plan_prediction
    from inhouse.bench.session import bench_sweep
    from inhouse.bench.sweep import concurrency_steps, parse_steps

    settings = _settings(**locals())
    try:
        average = input_len + output_len + (prefix_len if dataset == "shared-prefix" else 0)
        predicted = None if plan is None else plan_prediction(plan, gpu, average)
        chosen = parse_steps(steps) if steps else concurrency_steps(predicted, max_concurrency)
    except (PlanReferenceError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    if settings.slo.ttft is None:
        raise typer.BadParameter("--slo needs a ttft objective, e.g. ttft=2s")
    prediction = None
    if profile is not None:
        from inhouse.bench.predicted import predict_sweep

        try:
            prediction = predict_sweep(
                profile,
                chosen,
                input_len=input_len,
                output_len=output_len,
                len_spread=len_spread,
                per_slot=prompts_per_slot,
                minimum=min_prompts,
                slo_ttft=settings.slo.ttft,
            )
        except PlanError as exc:
            raise typer.BadParameter(str(exc)) from exc
    _session(
        lambda: bench_sweep(
            settings, chosen, predicted, prompts_per_slot, min_prompts, Console(), prediction
        )
    )


@bench_app.command("calibrate")
def calibrate(
    base_url: BaseUrl,
    model: Model,
    api_key: ApiKey = None,
    out: Annotated[Path, typer.Option(help="Where to write the profile JSON.")] = Path(
        "profile.json"
    ),
    max_num_seqs: Annotated[
        int, typer.Option(help="The server's max sequences a step (decode probes stop there).")
    ] = 64,
    max_num_batched_tokens: Annotated[
        int, typer.Option(help="The server's token budget a step (prefill probes stay within).")
    ] = 2048,
    timeout: Timeout = 120.0,
    acceptance_dataset: Annotated[
        Path | None,
        typer.Option(
            help="JSONL prompts (bench's dataset format) for the acceptance probe of a server "
            "that speculates; acceptance is workload-specific, so give the team's own traffic. "
            "Default: built-in copy, edit and summary requests."
        ),
    ] = None,
    acceptance_base_url: Annotated[
        str | None,
        typer.Option(
            help="The same model served with --speculative-config, for the acceptance probe, "
            "when --base-url is the server without it (then the step cost is speculation-free)."
        ),
    ] = None,
) -> None:
    """Fit the plan's step-time model with short probes (a minute or two); write a profile for
    `inhouse plan --profile` and `inhouse bench sweep --profile`. A server that speculates
    (`/version`'s speculative_config) also gets its acceptance measured."""
    from inhouse.bench.calibrate import CalibrationError, Target, calibrate, describe
    from inhouse.bench.datasets import DatasetError, read_jsonl
    from inhouse.bench.preflight import EndpointError

    try:
        prompts = None if acceptance_dataset is None else read_jsonl(acceptance_dataset, 128)
        target = Target(
            base_url, model, api_key, max_num_seqs, max_num_batched_tokens, timeout,
            acceptance_prompts=None if prompts is None else tuple(prompts),
            acceptance_base_url=acceptance_base_url,
        )  # fmt: skip
        profile = asyncio.run(calibrate(target))
    except (EndpointError, CalibrationError, PlanError, DatasetError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for line in describe(profile):
        typer.echo(line)
    out.write_text(json.dumps(profile.to_json(), indent=1) + "\n", encoding="utf-8")
    typer.echo(f"profile: {out}")
