"""Personas (system-prompt text) and voices (reference files), owned by a user or shared."""
