"""What a bench session was asked to do, checked before anything is sent."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from inhouse.bench.metrics import Slo
from inhouse.bench.requests import Endpoint

DatasetKind = Literal["random", "jsonl", "shared-prefix", "random-mm"]


class SettingsError(ValueError):
    """Options that cannot make a run; the message names the option."""


@dataclass(slots=True, frozen=True)
class DatasetSettings:
    """Which prompts to send and how long they and their answers are, in tokens."""

    kind: DatasetKind = "random"
    path: Path | None = None
    endpoint: Endpoint = "chat"
    input_len: int = 256
    output_len: int = 128
    len_spread: float = 0.0
    prefix_len: int = 1024
    num_questions: int = 16
    num_prefixes: int = 1  # shared-prefix: distinct prefixes (documents), each asked every question
    images_per_prompt: int = 1  # random-mm: images after each prompt's text
    image_size: tuple[int, int] = (512, 512)  # random-mm: their width and height in pixels

    def __post_init__(self) -> None:
        if self.kind == "jsonl" and self.path is None:
            raise SettingsError("--dataset jsonl needs --dataset-path FILE")
        if self.kind != "jsonl" and self.path is not None:
            raise SettingsError("--dataset-path is only for --dataset jsonl")
        if self.path is not None and not self.path.is_file():
            raise SettingsError(f"--dataset-path {self.path} is not a file")
        lengths = (self.input_len, self.output_len, self.prefix_len)
        if min(*lengths, self.num_questions, self.num_prefixes) < 1:
            raise SettingsError(
                "token lengths, --num-questions and --num-prefixes must be at least 1"
            )
        if not 0 <= self.len_spread < 1:
            raise SettingsError("--len-spread must lie in [0, 1)")
        if self.kind == "random-mm" and self.endpoint != "chat":
            raise SettingsError("--dataset random-mm sends images: it needs --endpoint chat")
        if self.images_per_prompt < 0 or min(self.image_size) < 1:
            raise SettingsError("--images-per-prompt must be 0 or more, --image-size positive")


@dataclass(slots=True, frozen=True)
class EndpointSettings:
    """Where to send requests and how each one is shaped beyond its prompt."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 300.0
    temperature: float | None = 0.0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise SettingsError(f"--base-url {self.base_url!r} must start with http:// or https://")
        if self.timeout <= 0:
            raise SettingsError("--timeout must be positive")

    def sampling(self) -> dict[str, Any]:
        """Extra body fields: temperature, and `ignore_eos` (a vLLM extension) only when set."""
        extra: dict[str, Any] = {}
        if self.temperature is not None:
            extra["temperature"] = self.temperature
        if self.ignore_eos:
            extra["ignore_eos"] = True
        return extra


@dataclass(slots=True, frozen=True)
class SessionSettings:
    """Everything a run or a sweep shares."""

    endpoint: EndpointSettings
    dataset: DatasetSettings
    slo: Slo
    seed: int = 0
    warmup: int = 2
    out: Path | None = None
    scrape_interval: float = 0.5
    metrics_urls: tuple[str, ...] = ()  # servers whose /metrics to read, else the base URL's

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise SettingsError("--warmup must be 0 or more")
        for url in self.metrics_urls:
            if not url.startswith(("http://", "https://")):
                raise SettingsError(f"--metrics-url {url!r} must start with http:// or https://")

    def config_json(self) -> dict[str, Any]:
        """The settings as recorded in the results file; the API key is never written."""
        dataset = asdict(self.dataset)
        dataset["path"] = None if self.dataset.path is None else str(self.dataset.path)
        endpoint = asdict(self.endpoint)
        endpoint.pop("api_key")
        endpoint["api_key_given"] = self.endpoint.api_key is not None
        return {
            **endpoint,
            "dataset": dataset,
            "slo": asdict(self.slo),
            "seed": self.seed,
            "warmup": self.warmup,
            "metrics_urls": list(self.metrics_urls),
        }
