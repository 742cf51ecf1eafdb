"""physics/: what a step should take before anything runs: the analytical model, the floor, memory,
the host-bound rule, cost, and their checks against measured steps (fit, audit)."""
