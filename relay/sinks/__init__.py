"""Where events go: HTTP collectors, and the dead-letter topic for what cannot be delivered."""
