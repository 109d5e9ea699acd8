"""Turn-based modes on a duplex engine: server-side voice activity detection and half-duplex turns.

``detector`` cuts a probability stream into speech turns (OpenAI ``server_vad`` semantics, no torch),
``vad`` computes those probabilities with the packaged Silero model, ``vad_thread`` runs it off the
event loop, and ``half_duplex`` is the session-side controller that turns commits into responses.
"""
