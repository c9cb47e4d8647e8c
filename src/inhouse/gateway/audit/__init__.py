"""The audit: one row a request, written through an append-only journal (`journal`) by
`writer`, and searched by `search` (the console)."""
