"""Checks of deploy/, docker-compose.yml and examples/: offline, against schemas and the relay's own code."""
