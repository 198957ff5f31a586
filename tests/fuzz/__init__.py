"""A differential fuzzer: random small programs run eagerly and through Kiln must agree."""
