"""The election: decides the session (master id + clock) (README, Architecture).

- `core`: the pure state machine (inputs with `now`, `Outputs` back); all the rules.
- `outputs`: what the core returns, and the notes it reports for logging.
- `service`: `Election`, the trio shell that feeds the core and carries out its outputs.
- `clock_store`: the node's clock, persisted in the data directory.
"""

from __future__ import annotations

from trexo.election.core import ElectionCore, ElectionStatistics
from trexo.election.outputs import CampaignReason, Outputs
from trexo.election.service import Election

__all__ = ["CampaignReason", "Election", "ElectionCore", "ElectionStatistics", "Outputs"]
