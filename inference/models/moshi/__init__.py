"""Moshi / PersonaPlex: the LM (``lm``), lockstep generation (``gen``), loading, prefill, replay; Mimi (``mimi``)."""
