"""Conversations: the realtime endpoint ``/v1/realtime`` and one ``Conversation`` row per session."""
