"""The engine's slot batch: the worker thread that steps it on a real clock (and runs chat replies between
ticks), the pool that admits sessions to its slots, and the tick timings it keeps."""
