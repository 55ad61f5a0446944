"""Clients the learner uses to drive the fleet."""
