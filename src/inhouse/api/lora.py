"""``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``: vLLM's bodies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from inhouse.plan.adapters import NAME as ADAPTER_NAME  # what requests give as ``model``


class LoadLoraAdapterRequest(BaseModel):
    """Load the PEFT adapter at ``lora_path`` (a folder on the server) as ``lora_name``."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(pattern=ADAPTER_NAME.pattern)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraAdapterRequest(BaseModel):
    """Stop serving ``lora_name``; requests already running with it finish."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=128)
