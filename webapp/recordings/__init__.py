"""Recorded sessions: the catalogue, post-processing into playable files, and the review pages."""
