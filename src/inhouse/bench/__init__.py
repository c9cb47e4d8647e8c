"""Load generator that checks the plan against a live endpoint."""
