"""Test helpers: a Kafka-protocol broker handle and an offline OpenLineage spec validator."""
