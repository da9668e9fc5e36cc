"""models/selfsup."""
