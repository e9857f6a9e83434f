"""The `orch` command line: thin commands over control, store, report (and the plan language)."""
