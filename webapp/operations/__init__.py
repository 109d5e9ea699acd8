"""Staff-only operations view: worker occupancy, tick timings and the queue, live."""
