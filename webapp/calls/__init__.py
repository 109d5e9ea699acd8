"""The browser call page: one page that runs a full-duplex call over ``/v1/realtime``."""
