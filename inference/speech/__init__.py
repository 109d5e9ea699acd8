"""Speech recognition over finished audio (consent phrases; caller transcripts), off the call's audio path."""
