"""The scheduling policy (`--scheduling-policy` fcfs, priority, fair) that the engine's
scheduler runs and the plan's simulation walks: who goes first in a step, and what work of
a worse priority waits. It reads a sequence through `Candidate` and knows nothing of KV
blocks, budgets or admission. Imports no torch."""
