"""Usage and teams: reports over the audit rows, the daily rollup, team budgets, and the
`inhouse usage` and `inhouse teams` commands."""
