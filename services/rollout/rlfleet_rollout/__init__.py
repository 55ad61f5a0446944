"""The rlfleet rollout service."""
