"""lineage-relay: carries OpenLineage events from Kafka to lineage collectors.

Pipeline (one folder per role): ``source/`` (Kafka) -> ``stages/`` (decode, dedupe,
order) -> ``sinks/`` (HTTP collectors, dead-letter topic); ``app.py`` wires them.
"""

__version__ = "0.1.0"
