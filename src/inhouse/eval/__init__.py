"""``inhouse eval``: a team's own eval set against one or two OpenAI-compatible endpoints.

Speaks HTTP only (any server: ours, the gateway, vLLM, a hosted API); never imports the
engine or torch.
"""
