"""Where events come from: a Kafka consumer group, and the offset bookkeeping that makes
delivery at-least-once."""
