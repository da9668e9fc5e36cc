"""models/heads."""
