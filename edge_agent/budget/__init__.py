"""This device's privacy budget: the ledger of what it has sent (SQLite), where that file
lives and who may touch it, the memo of repeated inputs, and ``edge-agent budget``.

Imports nothing: ``edge-agent --help`` and ``import edge_agent`` stay light."""
