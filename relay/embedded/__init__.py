"""Local stand-ins used by the demo and the tests: a Kafka-protocol broker, a recording collector, a sample event stream."""
