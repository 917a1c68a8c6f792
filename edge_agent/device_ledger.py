"""Kept for users' code (docs/ledger.md named it): ``edge_agent.budget.ledger``."""

from edge_agent.budget.ledger import DeviceLedger

__all__ = ["DeviceLedger"]
