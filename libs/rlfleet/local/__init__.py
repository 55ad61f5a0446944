"""Running the fleet as local processes on one machine (`make run`, tests, benches)."""
