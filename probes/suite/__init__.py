"""The probes: the registry that declares them, the cases and matrices they
run on, the reference's predictions, and the verdicts they earn."""
