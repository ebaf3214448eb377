"""Stand-in for torchax.ops: a package, so mappings imports."""
