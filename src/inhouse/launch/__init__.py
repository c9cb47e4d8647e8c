"""Launch serving engines with a plan's flags: inhouse, llama.cpp, vLLM, SGLang.

One module per engine implements `inhouse.launch.base.Engine`, which also holds the
engine's facts the gateway, bench and observe read (`Backend`: cache salt, `/tokenize`,
priority, metric names); `replicas` starts them, follows their logs and tells loading
from ready from crashed.
"""

from __future__ import annotations

from inhouse.launch.base import Backend, Engine, HostedBackend
from inhouse.launch.inhouse import InhouseEngine
from inhouse.launch.llamacpp import LlamaCppEngine
from inhouse.launch.sglang import SglangEngine
from inhouse.launch.vllm import VllmEngine

ENGINES: dict[str, Engine] = {
    engine.name: engine
    for engine in (InhouseEngine(), LlamaCppEngine(), VllmEngine(), SglangEngine())
}
# Every kind of upstream the gateway takes, by its `kind`: the engines and a hosted API.
BACKENDS: dict[str, Backend] = {
    backend.kind: backend for backend in (*ENGINES.values(), HostedBackend())
}
