"""Parley's inference side: engines, models and the co-located inference service.

Other packages import only ``inference.api`` and ``inference.contracts``.
"""
