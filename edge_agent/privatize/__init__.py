"""``edge-agent privatize``: its flags and options, reading lines in batches, the
``Privatizer`` (texts -> payloads), the device ledger's charge, and writing or posting.

Imports nothing: ``edge-agent --help`` and ``import edge_agent`` stay light."""
