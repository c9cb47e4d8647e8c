"""The release tools, run by hand and never on a request: the `inhouse release` command
and what it reports (status, the comparison of candidate and stable, grading, the PNG)."""
