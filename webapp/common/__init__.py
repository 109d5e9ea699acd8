"""Small shared pieces with no business logic."""
