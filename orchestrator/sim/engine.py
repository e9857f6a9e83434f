"""Virtual-time discrete-event engine (pure)."""
