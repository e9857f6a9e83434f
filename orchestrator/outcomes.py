"""What an experiment concludes, by name: a capacity's censoring and a bar's verdict.

Analysis decides them (``analysis.blocks.CapacityValue``, ``analysis.stats.check_bar``), the
store keeps them (``store.repository`` checks them; the tables' check constraints list the same
names) and the report prints them. Both analysis and the store import this module, which is why
it sits below both. Pure: standard library only.
"""

from __future__ import annotations

from typing import Literal, get_args

# Why a capacity is a bound, not a point estimate: the lowest rate of the search failed
# (``below_min``), its highest passed (``above_max``), or the load generator's ceiling capped
# the range and the capacity passed there (``at_ceiling``).
Censoring = Literal["below_min", "above_max", "at_ceiling"]
CENSORING: tuple[str, ...] = get_args(Censoring)

# A bar's verdict.
Verdict = Literal["ACCEPT", "REJECT", "INCONCLUSIVE"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
