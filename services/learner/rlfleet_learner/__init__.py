"""The rlfleet learner service."""
