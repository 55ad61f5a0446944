"""The rlfleet env service."""
