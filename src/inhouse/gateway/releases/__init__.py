"""Releases of a model as the running gateway applies them: the store, the canary and the
shadow on the request path, the answer checks, the guardrail with its live figures, and the
metrics. The `inhouse release` command and its reports are in `release_tools`."""
