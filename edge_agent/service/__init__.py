"""The privbert service as the edge sees it: the HTTP client, the edge bundle fetched once and
cached, and where a run's bundle and server come from (``ServerOptions``).

Imports nothing: ``edge-agent --help`` and ``import edge_agent`` stay light."""
