"""Native Token2Wav (Step-Audio 2 / CosyVoice 2): 25 Hz speech tokens -> 24 kHz audio, streamed per unit.

``config`` reads ``flow.yaml`` safely; ``encoder``, ``dit`` and ``flow`` are the causal flow-matching
decoder; ``hift`` is the vocoder; ``stream`` runs them chunk by chunk with per-session caches; ``loading``
checks and reads the published asset files; ``make_assets`` writes tiny random ones.
"""
