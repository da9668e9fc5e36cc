"""models/necks."""
