"""Speculative decoding: a drafter proposes tokens, the target verifies them inside the step."""
