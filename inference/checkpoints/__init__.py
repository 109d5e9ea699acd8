"""Checkpoints before they load: what a folder or hub id holds, whether its tensors fit the layout, and how
many sessions it serves on a given GPU (``python -m inference doctor``), plus hub ids resolved to folders."""
